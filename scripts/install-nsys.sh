#!/usr/bin/env bash
# Install NVIDIA Nsight Systems 2022.4.2 (Debian bookworm non-free) without touching the
# machine's apt sources: fetch the .debs through a private sources list that names non-free,
# unpack them with dpkg -x under PREFIX, and link `nsys` onto PATH. QdstrmImporter (which
# turns a CPU-only .qdstrm into .nsys-rep) needs libssh and libpfm, so libssh-4 and libpfm4 are
# installed too; without them nsys leaves only the .qdstrm (seen on a minimal Debian).
#
# usage: scripts/install-nsys.sh [PREFIX]   (default /opt/nsight-systems; needs root)
set -euo pipefail
PREFIX=${1:-/opt/nsight-systems}
BIN_DIR=${BIN_DIR:-/usr/local/bin}

if command -v nsys >/dev/null 2>&1; then
    echo "nsys already on PATH: $(command -v nsys)"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
# The machine's own Debian mirror and release, with the non-free component that its
# configured sources leave out.
mirror=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '/^deb / && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null || true)
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
if [ -z "$mirror" ]; then
    echo "install-nsys: no Debian mirror found in the apt sources" >&2
    exit 1
fi
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $codename non-free" > "$work/sources.list"
apt_opts=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o Dir::State::Lists="$work/lists" -o Dir::Cache::Archives="$work/archives")
apt-get "${apt_opts[@]}" update -qq
(cd "$work" && apt-get "${apt_opts[@]}" download nsight-systems nsight-systems-target)

mkdir -p "$PREFIX"
for deb in "$work"/*.deb; do
    dpkg -x "$deb" "$PREFIX"
done

# wait for another apt/dpkg run (CI setup may run several) instead of failing on its lock
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends libssh-4 libpfm4 >/dev/null
nsys_bin=$(find "$PREFIX" -type f -name nsys -path '*target-linux-x64*' | head -n1)
if [ -z "$nsys_bin" ]; then
    echo "install-nsys: no nsys binary inside the unpacked packages under $PREFIX" >&2
    exit 1
fi
importer=$(find "$PREFIX" -type f -name QdstrmImporter | head -n1)
if [ -n "$importer" ]; then
    # QdstrmImporter looks for libssh.so without a version suffix.
    libssh=$(find / -xdev -name 'libssh.so.4*' -type f 2>/dev/null | head -n1)
    if [ -n "$libssh" ]; then
        ln -sf "$libssh" "$(dirname "$importer")/libssh.so"
    fi
fi
ln -sf "$nsys_bin" "$BIN_DIR/nsys"
if [ -n "$importer" ] && ldd "$importer" | grep -q "not found"; then
    echo "install-nsys: QdstrmImporter lacks libraries:" $(ldd "$importer" | awk '/not found/ {print $1}' | sort -u) >&2
    exit 1
fi
echo "nsys: $("$BIN_DIR/nsys" --version 2>&1 | head -n1)"
echo "QdstrmImporter: ${importer:-not found}"
