"""A job spec and the small files it names, read the way emberctl reads them.

A spec is a path to a YAML/JSON file, YAML text, or a dict. Relative files the spec names
(data.path, data.text_path, checkpoint.init_from_safetensors, worker.script) that sit beside a
spec file are uploaded with it (SubmitRequest.files, 8 MiB each at most), as emberctl does.
"""
import os

import yaml

MAX_FILE_BYTES = 8 << 20
UPLOADED = (("data", "path"), ("data", "text_path"), ("checkpoint", "init_from_safetensors"),
            ("worker", "script"))


def load_spec(spec, nproc=0):
    """Returns (yaml_text, files: dict name -> bytes). Raises ValueError on a malformed spec."""
    base = None
    if isinstance(spec, dict):
        root = spec
    else:
        text = spec
        if isinstance(spec, os.PathLike) or (isinstance(spec, str) and "\n" not in spec
                                             and os.path.isfile(spec)):
            path = os.fspath(spec)
            with open(path, "r", encoding="utf-8") as f:
                text = f.read()
            base = os.path.dirname(os.path.abspath(path))
        try:
            root = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError("job spec is not valid YAML: %s" % e) from None
        if not isinstance(root, dict):
            raise ValueError("job spec must be a mapping of fields (got %s); see docs/spec.md"
                             % type(root).__name__)
    if nproc > 0:
        root = dict(root)
        par = dict(root.get("parallelism") or {})
        par["world_size"] = int(nproc)
        root["parallelism"] = par
    files = {}
    if base is not None:
        for section, key in UPLOADED:
            sec = root.get(section)
            rel = sec.get(key) if isinstance(sec, dict) else None
            if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in rel:
                continue
            p = os.path.join(base, rel)
            if os.path.isfile(p) and os.path.getsize(p) <= MAX_FILE_BYTES:
                with open(p, "rb") as f:
                    files[rel] = f.read()
    return yaml.safe_dump(root, sort_keys=False), files
