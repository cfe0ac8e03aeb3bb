// TokenDataset loading (text, folders, llm.c token files) and the sharded BatchLoader.
#include "zinf/model/data.h"

#include <fcntl.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <set>

#include "common/file_io.h"
#include "model/rng.h"
#include "zinf/log.h"

namespace zinf::model {

static_assert(std::endian::native == std::endian::little,
              "llm.c token files are little-endian; add byte swapping for this host");

namespace fs = std::filesystem;

namespace {

using fileio::UniqueFd;

// Reads exactly n bytes at offset (the common toolkit: short reads, EINTR, the end of the file).
Status read_exact(int fd, const std::string& path, void* buf, size_t n, uint64_t offset) {
  return fileio::pread_exact(fd, path, buf, n, offset);
}

enum class FileKind { kText, kTokens };

struct Loaded {
  std::vector<uint16_t> tokens;
  FileKind kind = FileKind::kText;
  std::string first_text;  // first file of each kind, for the mixing error
  std::string first_tokens;
  size_t files = 0;
};

Status append_llmc_tokens(int fd, const std::string& path, uint64_t size, Loaded* out) {
  int32_t header[kLlmcHeaderInts];
  if (size < sizeof(header)) {
    return Status::corruption(
        fmt::format("{}: truncated llm.c token file: {} bytes, less than the {}-byte header", path,
                    size, sizeof(header)));
  }
  ZINF_RETURN_IF_ERROR(read_exact(fd, path, header, sizeof(header), 0));
  if (header[0] != kLlmcMagic) {
    return Status::corruption(fmt::format(
        "{}: bad magic {} for an llm.c token file (expected {}; Llama-3 files with uint32 "
        "tokens, magic 20240801, are not supported)",
        path, header[0], kLlmcMagic));
  }
  if (header[1] != kLlmcVersion) {
    return Status::unsupported(
        fmt::format("{}: llm.c token file version {} is not supported (expected {})", path,
                    header[1], kLlmcVersion));
  }
  const int64_t ntok = header[2];
  const uint64_t expected = sizeof(header) + 2 * static_cast<uint64_t>(std::max<int64_t>(ntok, 0));
  if (ntok < 0 || size != expected) {
    return Status::corruption(fmt::format(
        "{}: llm.c token file header says {} tokens ({} bytes in all) but the file has {} bytes",
        path, ntok, expected, size));
  }
  const size_t base = out->tokens.size();
  out->tokens.resize(base + static_cast<size_t>(ntok));
  ZINF_RETURN_IF_ERROR(read_exact(fd, path, out->tokens.data() + base,
                                  2 * static_cast<size_t>(ntok), sizeof(header)));
  for (size_t i = base; i < out->tokens.size(); i++) {
    if (out->tokens[i] >= kGpt2Vocab) {
      return Status::corruption(fmt::format("{}: token {} at position {} is not below {}", path,
                                            out->tokens[i], i - base, kGpt2Vocab));
    }
  }
  return Status::ok();
}

Status append_text(int fd, const std::string& path, uint64_t size, Loaded* out) {
  std::vector<uint8_t> chunk(std::min<uint64_t>(size, 1 << 20));
  out->tokens.reserve(out->tokens.size() + size);
  for (uint64_t off = 0; off < size; off += chunk.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), size - off));
    ZINF_RETURN_IF_ERROR(read_exact(fd, path, chunk.data(), n, off));
    out->tokens.insert(out->tokens.end(), chunk.begin(), chunk.begin() + n);
  }
  return Status::ok();
}

Status append_file(const std::string& path, Loaded* out) {
  ZINF_ASSIGN_OR_RETURN(UniqueFd fd, fileio::open_file(path, O_RDONLY, 0, "reading"));
  ZINF_ASSIGN_OR_RETURN(const uint64_t size, fileio::file_size(fd.get(), path));
  int32_t magic = 0;
  if (size >= sizeof(magic)) ZINF_RETURN_IF_ERROR(read_exact(fd.get(), path, &magic, 4, 0));
  const bool tokens = magic == kLlmcMagic || fs::path(path).extension() == ".bin";
  std::string& first = tokens ? out->first_tokens : out->first_text;
  if (first.empty()) first = path;
  if (!out->first_tokens.empty() && !out->first_text.empty()) {
    return Status::invalid_argument(
        fmt::format("cannot mix text ({}) and llm.c token files ({}) in one dataset",
                    out->first_text, out->first_tokens));
  }
  out->kind = tokens ? FileKind::kTokens : FileKind::kText;
  out->files++;
  return tokens ? append_llmc_tokens(fd.get(), path, size, out)
                : append_text(fd.get(), path, size, out);
}

// Regular files under dir, sorted, each real file once, hidden names skipped.
Result<std::vector<std::string>> list_files(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  if (ec) return Status::sys_error("list " + dir, ec.value());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return Status::sys_error("list " + dir, ec.value());
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec)) paths.push_back(it->path().string());
  }
  if (ec) return Status::sys_error("list " + dir, ec.value());
  std::sort(paths.begin(), paths.end());
  // Each real file once, at its own name when it is listed, else at its first link's name.
  std::vector<std::string> real(paths.size());
  std::set<std::string> listed_directly;
  for (size_t i = 0; i < paths.size(); i++) {
    fs::path r = fs::canonical(paths[i], ec);
    real[i] = ec ? paths[i] : r.string();
    if (!fs::is_symlink(paths[i], ec)) listed_directly.insert(real[i]);
  }
  std::vector<std::string> unique;
  std::set<std::string> seen;
  for (size_t i = 0; i < paths.size(); i++) {
    const bool link = fs::is_symlink(paths[i], ec);
    if (link && listed_directly.count(real[i]) != 0) continue;
    if (seen.insert(real[i]).second) unique.push_back(paths[i]);
  }
  return unique;
}

Result<TokenDataset> load_files(const std::vector<std::string>& files, const std::string& where) {
  Loaded loaded;
  for (const std::string& f : files) ZINF_RETURN_IF_ERROR(append_file(f, &loaded));
  const int vocab = loaded.kind == FileKind::kTokens ? kGpt2Vocab : kByteVocab;
  std::string source = fmt::format("{} {} file{}, {} tokens{}", loaded.files,
                                   loaded.kind == FileKind::kTokens ? "llm.c token" : "text",
                                   loaded.files == 1 ? "" : "s", loaded.tokens.size(), where);
  return TokenDataset::from_tokens(std::move(loaded.tokens), vocab, std::move(source));
}

}  // namespace

Result<TokenDataset> TokenDataset::load(const std::string& path) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    return Status::not_found(fmt::format("data path {}: No such file or directory", path));
  }
  if (fs::is_directory(st)) {
    ZINF_ASSIGN_OR_RETURN(std::vector<std::string> files, list_files(path));
    if (files.empty()) {
      return Status::invalid_argument(fmt::format("data folder {} has no regular files", path));
    }
    return load_files(files, " under " + path);
  }
  if (!fs::is_regular_file(st)) {
    return Status::invalid_argument(fmt::format("data path {} is not a file or folder", path));
  }
  return load_files({path}, " from " + path);
}

TokenDataset TokenDataset::load_default(const std::string& licenses_dir) {
  constexpr size_t kMinBytes = 16 << 10;
  std::error_code ec;
  if (fs::is_directory(licenses_dir, ec)) {
    Result<std::vector<std::string>> files = list_files(licenses_dir);
    if (files.is_ok() && !files->empty()) {
      Result<TokenDataset> ds = load_files(*files, " under " + licenses_dir);
      if (ds.is_ok() && ds->vocab_size() == kByteVocab && ds->size() >= kMinBytes) {
        ds->source_ = "default corpus: " + ds->source_;
        return std::move(ds).value();
      }
    }
  }
  log_once(
      LogLevel::kInfo, "zinf.model.generated_corpus",
      fmt::format("default corpus: no usable texts under {}; using generated text", licenses_dir));
  std::string text = generated_corpus(64 << 10);
  const size_t n = text.size();
  return from_text(text, fmt::format("default corpus: generated text, {} tokens", n));
}

TokenDataset TokenDataset::from_text(std::string_view text, std::string source) {
  std::vector<uint16_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); i++) tokens[i] = static_cast<unsigned char>(text[i]);
  TokenDataset ds;
  ds.end_ = tokens.size();
  ds.storage_ = std::make_shared<const std::vector<uint16_t>>(std::move(tokens));
  ds.vocab_size_ = kByteVocab;
  ds.source_ = std::move(source);
  return ds;
}

Result<TokenDataset> TokenDataset::from_tokens(std::vector<uint16_t> tokens, int vocab_size,
                                               std::string source) {
  if (vocab_size < 1 || vocab_size > 65536) {
    return Status::invalid_argument(
        fmt::format("vocab_size ({}) must be between 1 and 65536 for 16-bit tokens", vocab_size));
  }
  for (size_t i = 0; i < tokens.size(); i++) {
    if (tokens[i] >= vocab_size) {
      return Status::invalid_argument(fmt::format("{}: token {} at position {} is not below {}",
                                                  source, tokens[i], i, vocab_size));
    }
  }
  TokenDataset ds;
  ds.end_ = tokens.size();
  ds.storage_ = std::make_shared<const std::vector<uint16_t>>(std::move(tokens));
  ds.vocab_size_ = vocab_size;
  ds.source_ = std::move(source);
  return ds;
}

std::span<const uint16_t> TokenDataset::tokens() const {
  if (!storage_) return {};
  return std::span<const uint16_t>(*storage_).subspan(begin_, end_ - begin_);
}

TokenDataset TokenDataset::slice(size_t begin, size_t end) const {
  TokenDataset ds = *this;
  end = std::min(end, size());
  begin = std::min(begin, end);
  ds.begin_ = begin_ + begin;
  ds.end_ = begin_ + end;
  ds.source_ = fmt::format("{} [{}, {})", source_, begin, end);
  return ds;
}

Status write_llmc_tokens(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    return Status::invalid_argument(
        fmt::format("{}: {} tokens do not fit an llm.c header", path, tokens.size()));
  }
  int32_t header[kLlmcHeaderInts] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  ZINF_ASSIGN_OR_RETURN(UniqueFd fd, fileio::open_file(path, O_WRONLY | O_CREAT | O_TRUNC, 0644, "writing"));
  auto write_all = [&](const void* buf, size_t n, uint64_t offset) {
    return fileio::pwrite_all(fd.get(), path, buf, n, offset);
  };
  ZINF_RETURN_IF_ERROR(write_all(header, sizeof(header), 0));
  return write_all(tokens.data(), tokens.size_bytes(), sizeof(header));
}

}  // namespace zinf::model
