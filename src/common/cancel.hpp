// Cooperative cancellation. A front end's signal handler calls
// request_stop() (async-signal-safe: a lock-free atomic store); long loops
// call throw_if_stopped() between chunks, which unwinds through the normal
// cleanup path (temporary files removed, finished shards kept for --resume).
#pragma once

namespace mx2nv {

void request_stop(int signal_number) noexcept;
void throw_if_stopped();
bool stop_requested() noexcept;
// The signal request_stop() was given (-1 for a request without one); 0: none.
int stop_signal() noexcept;
// "SIGINT", "SIGTERM" or "a stop request" (throw_if_stopped's message names it).
const char* stop_signal_name() noexcept;
// Forgets a stop request once the interrupted work has unwound, so a
// long-lived host (the Python package) can run the next command.
void clear_stop() noexcept;

}  // namespace mx2nv
