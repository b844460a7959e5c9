# Source from the repository root on a GPU machine without internet before a GPU benchmark:
#     source bench/device_env.sh
# Installs kvsplit over the machine's own torch and triton (no dependency fetched) and, where they were carried
# in the git-ignored folder .peers/, puts the peer implementations on the path:
# - FlashInfer 0.7.2: .peers/fi_trim.tar.xz and .peers/deps/*.whl, made by the team tool
#   `bash ../shared/tools/flashinfer_for_device.sh .peers`;
# - FlashAttention-3: .peers/fa3_for_device/ (a copy of ../shared/tools/fa3_for_device), built once per machine
#   into /tmp/fa3 (about 90 s); KVSPLIT_NO_FA3=1 skips it.
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR="$PWD/.triton_cache"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "install failed"; return 1; }
if [ -f .peers/fi_trim.tar.xz ]; then
    mkdir -p /tmp/fi /tmp/site && tar xJf .peers/fi_trim.tar.xz -C /tmp/fi \
        && python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .peers/deps/*.whl
    export PYTHONPATH=/tmp/site:/tmp/fi:${PYTHONPATH:-}
fi
if [ -d .peers/fa3_for_device ] && [ -z "${KVSPLIT_NO_FA3:-}" ]; then
    ls /tmp/fa3/hopper/flash_attn_3/_C*.so >/dev/null 2>&1 || bash .peers/fa3_for_device/build.sh >/tmp/fa3_build.log 2>&1 \
        || echo "fa3 build failed (/tmp/fa3_build.log)"
    export PYTHONPATH=/tmp/fa3/hopper:${PYTHONPATH:-}
fi
