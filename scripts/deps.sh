#!/bin/sh
# deps.sh — make sure the Debian packages kvengine builds and tests with are
# installed. As root it installs what is missing with apt-get; otherwise it
# prints the apt-get line to run and fails.
set -eu
PKGS="build-essential pkg-config librocksdb-dev libibverbs-dev librdmacm-dev \
liblz4-dev libyaml-dev check libsubunit-dev libjemalloc-dev libxxhash-dev \
python3-pytest python3-numpy \
libmicrohttpd-dev gnuplot-nox libcurl4-openssl-dev libjson-c-dev libssl-dev etcd-server"
[ $# -gt 0 ] && PKGS="$PKGS $*"
# clang and its sanitizer and libFuzzer runtimes: make fuzz (tests/fuzz/).
PKGS="$PKGS clang libclang-rt-14-dev"
# openssl (the command): the etcd suite's https test makes its certificates.
PKGS="$PKGS openssl"
# python3-msgpack: tools/anchor-suites.sh runs Mooncake's own structured_object_store.py, which imports msgpack.
PKGS="$PKGS python3-msgpack"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
        missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "kvengine: missing Debian packages:$missing" >&2
    echo "kvengine: install them with: sudo apt-get install$missing" >&2
    exit 1
fi
echo "kvengine: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
