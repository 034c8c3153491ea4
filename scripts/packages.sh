# Sourced by scripts/demo and scripts/test: installs, with apt-get, what a test node needs —
# containerd, runc, the CNI plugins, a static busybox for the images, haproxy and rsyslog for the
# traffic image, and the C toolchain with libc.a that the static entrypoint links against.

# apt-get, retried while another dpkg/apt holds its lock (unattended upgrades on a fresh VM).
apt_get() {
    local tries=0
    until DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=60 "$@"; do
        tries=$((tries + 1))
        if [ "$tries" -ge 10 ]; then
            echo "apt-get $* kept failing" >&2
            return 1
        fi
        echo "apt-get busy or failed; retrying in 6 s ($tries/10)" >&2
        sleep 6
    done
}

# Prints the packages that are missing, one line.
missing_node_packages() {
    local missing=()
    command -v containerd >/dev/null 2>&1 || missing+=(containerd)
    command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing+=(runc)
    dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
    command -v cc >/dev/null 2>&1 || missing+=(gcc)
    dpkg -s libc6-dev >/dev/null 2>&1 || missing+=(libc6-dev)
    # The pod network of user-namespaced pods (ptp, host-local).
    [ -x /usr/lib/cni/ptp ] || [ -x /opt/cni/bin/ptp ] || missing+=(containernetworking-plugins)
    # The traffic benchmark's and the demo's real proxy and log shipper (their image is built
    # from these binaries and their libraries).
    [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
    [ -x /usr/sbin/rsyslogd ] || missing+=(rsyslog)
    echo "${missing[*]}"
}

# Installs what is missing; returns non-zero when it cannot (not root, no apt-get).
ensure_node_packages() {
    local missing
    missing=$(missing_node_packages)
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "missing: $missing (install them as root with apt-get)" >&2
        return 1
    fi
    echo "installing $missing"
    apt_get update -q
    # shellcheck disable=SC2086
    apt_get install -y -q $missing
}
