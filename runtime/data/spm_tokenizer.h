// A SentencePiece model for make-tokens, behind an interface free of Abseil: Debian's
// sentencepiece_processor.h declares `absl::string_view` as std::string_view, which clashes with
// Abseil's own string_view, so only spm_tokenizer.cc includes it (and no Abseil header).
// Thread-compatible (one tokenizer per thread).
#ifndef EMBER_RUNTIME_DATA_SPM_TOKENIZER_H_
#define EMBER_RUNTIME_DATA_SPM_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

namespace ember::data {

class SpmTokenizer {
 public:
  // Parses a serialized model (the .model file's bytes); nullptr with *error set on failure.
  static std::unique_ptr<SpmTokenizer> Load(const std::string& model_bytes, std::string* error);
  ~SpmTokenizer();
  int vocab_size() const;
  // Appends the ids of `text` to *ids; false with *error set on failure.
  bool Encode(const std::string& text, std::vector<int>* ids, std::string* error) const;

 private:
  SpmTokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::data

#endif  // EMBER_RUNTIME_DATA_SPM_TOKENIZER_H_
