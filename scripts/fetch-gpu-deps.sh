#!/usr/bin/env bash
# For machines without a package registry (the GPU host): downloads the Debian -dev packages
# that may be missing there (header-only ones: gloo's declare the CPU ranks' c10d backend, dist/;
# and SQLite for the verdict cache) and unpacks them
# into .deps/; and cpp-httplib header-only, for `kz serve-eval` (without it the service is not
# built): Debian ships it compiled, against OpenSSL and Brotli, which the GPU host may lack, so
# its source package's httplib.h is taken instead, checked against the .dsc's SHA-256 and with
# Debian's patches applied. Then, there:
#   KZ_SKIP_APT=1 KZ_PYTHON=$(command -v python3) KZ_DEPS_PREFIX=$PWD/.deps scripts/setup.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$ROOT/.deps/debs"
cd "$ROOT/.deps/debs"
apt-get download libtomlplusplus-dev libxxhash-dev libcli11-dev nlohmann-json3-dev libsqlite3-dev libsqlite3-0 \
  libgloo-dev >/dev/null
for deb in *.deb; do dpkg -x "$deb" "$ROOT/.deps"; done
HTTPLIB_POOL=https://deb.debian.org/debian/pool/main/c/cpp-httplib
HTTPLIB_ORIG=cpp-httplib_0.11.4+ds.orig.tar.xz
HTTPLIB_DEBIAN=cpp-httplib_0.11.4+ds-1+deb12u1.debian.tar.xz
curl -sSfO "$HTTPLIB_POOL/$HTTPLIB_ORIG"
curl -sSfO "$HTTPLIB_POOL/$HTTPLIB_DEBIAN"
sha256sum -c --quiet <<SUMS
8b1a5df569003b6a4f24c68489bbda5c64aec94697bdc9ebba5d79408b2ae7eb  $HTTPLIB_ORIG
a0adf8a38610806f6d94ba69839438635e5e6580775e28ff31d6a081e34f1484  $HTTPLIB_DEBIAN
SUMS
HTTPLIB_SRC=$(mktemp -d)
tar -xf "$HTTPLIB_ORIG" -C "$HTTPLIB_SRC" --strip-components=1
tar -xf "$HTTPLIB_DEBIAN" -C "$HTTPLIB_SRC"
while read -r patch; do
  [[ -n $patch && $patch != \#* ]] && patch -s -d "$HTTPLIB_SRC" -p1 < "$HTTPLIB_SRC/debian/patches/$patch"
done < "$HTTPLIB_SRC/debian/patches/series"
install -D -m 644 "$HTTPLIB_SRC/httplib.h" "$ROOT/.deps/usr/include/httplib.h"
rm -rf "$HTTPLIB_SRC" "$HTTPLIB_ORIG" "$HTTPLIB_DEBIAN"
echo "unpacked into $ROOT/.deps: $(ls "$ROOT/.deps/debs" | tr '\n' ' ')and httplib.h (cpp-httplib, header-only)"
