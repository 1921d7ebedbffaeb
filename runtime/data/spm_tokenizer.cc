#include "runtime/data/spm_tokenizer.h"

#include "sentencepiece_processor.h"  // no Abseil header in this file: see spm_tokenizer.h

namespace ember::data {

struct SpmTokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

SpmTokenizer::SpmTokenizer() : impl_(new Impl) {}
SpmTokenizer::~SpmTokenizer() = default;

std::unique_ptr<SpmTokenizer> SpmTokenizer::Load(const std::string& model_bytes, std::string* error) {
  std::unique_ptr<SpmTokenizer> t(new SpmTokenizer());
  const auto st = t->impl_->sp.LoadFromSerializedProto(model_bytes);
  if (!st.ok()) {
    *error = st.ToString();
    return nullptr;
  }
  return t;
}

int SpmTokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }

bool SpmTokenizer::Encode(const std::string& text, std::vector<int>* ids, std::string* error) const {
  std::vector<int> out;
  const auto st = impl_->sp.Encode(text, &out);
  if (!st.ok()) {
    *error = st.ToString();
    return false;
  }
  ids->insert(ids->end(), out.begin(), out.end());
  return true;
}

}  // namespace ember::data
