#include "sys/batched_io.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

namespace mx2nv {

BatchedReader::BatchedReader(const File& file, std::vector<ByteRange> ranges)
    : file_(file), ranges_(std::move(ranges)) {}

void BatchedReader::fill_window(std::size_t first) {
  const ByteRange& r = ranges_[first];
  const std::uint64_t start = r.offset;
  std::uint64_t end = r.offset + r.length;
  std::uint64_t useful = r.length;
  for (std::size_t j = first + 1; j < ranges_.size(); ++j) {
    const ByteRange& n = ranges_[j];
    // Only forward: the requests of a pass run front to back, and a jump
    // back (the next pass) starts a window of its own.
    if (n.offset < start || n.offset + n.length > start + kWindowBytes) break;
    const std::uint64_t gap = n.offset > end ? n.offset - end : 0;
    if (gap > std::max(kMergeGap, useful)) break;
    end = std::max(end, n.offset + n.length);
    useful += n.length;
  }
  window_.resize(static_cast<std::size_t>(std::max<std::uint64_t>(window_.size(), end - start)));
  file_.read_at(start, {window_.data(), static_cast<std::size_t>(end - start)});
  ++reads_;
  window_offset_ = start;
  window_size_ = end - start;
}

std::span<const std::byte> BatchedReader::next() {
  if (next_ >= ranges_.size()) return {};
  const std::size_t i = next_++;
  const ByteRange& r = ranges_[i];
  const bool inside = r.offset >= window_offset_ && r.offset - window_offset_ <= window_size_ &&
                      r.length <= window_size_ - (r.offset - window_offset_);
  if (!inside || window_size_ == 0) fill_window(i);
  return {window_.data() + (r.offset - window_offset_), static_cast<std::size_t>(r.length)};
}

CoalescingWriter::CoalescingWriter(const File& file, std::size_t capacity, Written on_written)
    : file_(file),
      buffer_(std::make_unique_for_overwrite<std::byte[]>(capacity)),
      capacity_(capacity),
      on_written_(std::move(on_written)) {}

void CoalescingWriter::write_through(std::uint64_t offset, std::span<const std::byte> bytes) {
  file_.write_at(offset, bytes);
  ++writes_;
  if (on_written_) on_written_(offset, bytes.size());
}

void CoalescingWriter::write(std::uint64_t offset, std::span<const std::byte> bytes) {
  if (bytes.empty()) return;
  if (used_ > 0 && (offset != buffer_offset_ + used_ || bytes.size() > capacity_ - used_)) flush();
  if (bytes.size() >= capacity_) {
    write_through(offset, bytes);
    return;
  }
  if (used_ == 0) buffer_offset_ = offset;
  std::memcpy(buffer_.get() + used_, bytes.data(), bytes.size());
  used_ += bytes.size();
}

void CoalescingWriter::flush() {
  if (used_ == 0) return;
  const std::size_t n = std::exchange(used_, 0);
  write_through(buffer_offset_, {buffer_.get(), n});
}

}  // namespace mx2nv
