// The process heap between phases of a command.
#pragma once

namespace mx2nv {

// Hands the heap's free pages back to the system (glibc's malloc_trim; a
// no-op elsewhere). A command calls it after dropping a phase's many small
// allocations (an index's names, key tables): without it those pages stay
// resident, and the next phase's large buffers, which malloc maps fresh,
// add to the peak beside them instead of reusing them.
void release_free_heap();

}  // namespace mx2nv
