#!/bin/bash
# docs/model.md rebuilt by an outside reader (issue 22): model_doc_check.py, written from the
# document alone, must reproduce Ember's Llama initialisation bitwise and its logits and loss
# within float32 tolerance (llama_logits on three tiny configs). SKIPPED when Debian's python3
# lacks numpy.
set -euo pipefail
tool="$1"
check="$2"
if ! /usr/bin/python3 -c "import numpy" 2>/dev/null; then
  echo "SKIPPED: /usr/bin/python3 has no numpy (apt-get install python3-numpy)"
  exit 0
fi
work="${TEST_TMPDIR:-$(mktemp -d)}/doccheck"
mkdir -p "$work"
exec /usr/bin/python3 "$check" --llama_logits="$tool" --workdir="$work" --rtol=1e-5
