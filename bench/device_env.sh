# Sourced by the round-7 device scripts (bench/r7_call*.sh) on the H200 machine, from the repo root: installs the
# project over the image's torch/triton (no dependencies fetched: the machine reaches no registry) and puts the
# trimmed FlashInfer of .peers/ (../shared/tools/flashinfer_for_device.sh .peers, carried with the call) on the path.
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR="$PWD/.triton_cache"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "install failed"; exit 1; }
if [ -f .peers/fi_trim.tar.xz ]; then
    mkdir -p /tmp/fi /tmp/site && tar xJf .peers/fi_trim.tar.xz -C /tmp/fi \
        && python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .peers/deps/*.whl
    export PYTHONPATH=/tmp/site:/tmp/fi:${PYTHONPATH:-}
fi
