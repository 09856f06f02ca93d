// The target's regenerated replies (data.regenerate), kept in the job's output folder so that a
// job started again (resumed, restarted after a crash, or redeployed) does not answer every
// prompt again: on a real data set regeneration is the largest cost of all. One record per data
// line, appended and flushed as each line is regenerated, so an interrupted regeneration goes on
// from the last whole record.
//
// File: "FDREGEN1", u32 key length, the key, then records of
//   u64 line number, u32 token count n, n × i64 ids, n × u8 loss mask, u32 CRC-32C of the record.
// The key names what the replies depend on (RegenerationKey); a file with another key is started
// over. The records are only as good as their CRC: whoever takes one checks its values. A record
// cut short or failing its CRC ends what is read (the file is truncated there and appended to).
// Sizes read from the file are checked against what is left of it before anything is allocated.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat_template.h"

namespace flashdraft {

class RegenerationCache {
 public:
  struct Entry {
    std::vector<int64_t> ids;
    std::vector<int64_t> mask;
  };

  // Opens the cache at `path` for `key`, reading the records already there (`path`'s folder must
  // exist). Errors name the file.
  static absl::StatusOr<std::unique_ptr<RegenerationCache>> Open(const std::string& path,
                                                                 const std::string& key);
  ~RegenerationCache();
  RegenerationCache(const RegenerationCache&) = delete;
  RegenerationCache& operator=(const RegenerationCache&) = delete;

  // Line `line_no`'s regenerated sample as the file holds it, handed over (the cache keeps no
  // copy: a data set's tokens are held once, by the source); nothing when it is not there.
  std::optional<Entry> Take(int64_t line_no);
  // Adds line `line_no` (ids and mask of one length, mask values 0 or 1) to the file and flushes
  // it; the cache keeps no copy.
  absl::Status Append(int64_t line_no, const std::vector<int64_t>& ids,
                      const std::vector<int64_t>& mask);
  // Records read at Open and not yet taken.
  size_t size() const { return entries_.size(); }
  // What Open found: "" (a new file), or why earlier records were dropped.
  const std::string& note() const { return note_; }

 private:
  RegenerationCache() = default;
  // Reads the records of an open file whose header matched; `end` is the offset after the last
  // whole record.
  void ReadRecords(const std::string& data, size_t offset, size_t* end);

  std::string path_;
  std::FILE* file_ = nullptr;
  std::map<int64_t, Entry> entries_;
  std::string note_;
};

// The CRC-32C of a whole file (read in pieces) and, in `bytes`, its size; an error names the file.
absl::StatusOr<uint32_t> FileCrc32c(const std::string& path, uint64_t* bytes = nullptr);

// The key of a job's regenerated replies: the parts they depend on, readable in a log line.
// `target` names the model and where it runs (its fingerprint, device, dtype); the target folder's
// weight files count by name, size and modification time (another checkpoint of the same layout is
// another key; reading gigabytes of weights only to key a cache is not worth it), the data file and
// the tokenizer by size and CRC-32C (the data files in order: a line's number counts through them),
// the chat options as ChatOptionsKey says them.
std::string RegenerationKey(const std::string& target, const std::string& target_dir,
                            const std::vector<std::string>& data_paths, int64_t max_new_tokens,
                            const std::string& tokenizer, const ChatRenderOptions& chat);

}  // namespace flashdraft
