#!/usr/bin/env bash
# Fetch Nsight Systems from Debian's non-free component into a private folder and print
# the path of the `nsys` binary.
#
# Nothing of the system's apt configuration or state changes: apt runs with its own
# sources list, state, cache and log folders under the cache folder, and the packages are
# unpacked with `dpkg-deb -x` (no dpkg database, no maintainer scripts, no root needed
# beyond what apt itself wants). A second run finds the stamp and returns at once.
#
# Environment:
#   POLICY_ENGINE_CACHE  cache root (default ~/.cache/policy-engine); files go to <root>/nsys
#   NSYS_DEBIAN_MIRROR   Debian mirror (default: the one this machine's apt sources use)
#   NSYS_DEBIAN_SUITE    suite whose non-free holds nsight-systems (default bookworm: 2022.4)
#   NSYS_DEBIAN_KEYRING  keyring that signs the suite (default Debian's archive keyring)
#
# Exit status: 0 and the nsys path on stdout; 2 when the tool cannot be had here (no apt,
# no keyring, no network, package missing for this architecture), with the reason on
# stderr, so tests can skip with it; anything else is a bug in this script.
set -euo pipefail

# The Debian archive this machine's own apt configuration names (deb822 .sources files or
# one-line sources.list entries), so the script reaches only what apt here already does.
system_mirror() {
    local f found=""
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -r $f && -z $found ]] || continue
        found=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) {print $i; exit}}' "$f" || true)
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r $f && -z $found ]] || continue
        found=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) {print $i; exit}}' "$f" || true)
    done
    echo "$found"
}
mirror=${NSYS_DEBIAN_MIRROR:-$(system_mirror)}
suite=${NSYS_DEBIAN_SUITE:-bookworm}
keyring=${NSYS_DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
cache=${POLICY_ENGINE_CACHE:-${HOME:?HOME is not set}/.cache/policy-engine}/nsys
root=$cache/root
stamp=$root/.nsys-path
# libssh-4 (main): the report importer links libssh.so through a relative symlink that
# points into the unpacked tree, so the library must be unpacked next to it.
packages=(nsight-systems nsight-systems-target libssh-4)

unavailable() {
    echo "install_nsys: unavailable: $*" >&2
    exit 2
}

installed() {
    [[ -f $stamp ]] || return 1
    nsys=$(<"$stamp")
    [[ -x $nsys ]] || return 1
    echo "$nsys"
}

installed && exit 0
mkdir -p "$cache"
# Two runs at once (parallel test workers) take turns; the second finds the stamp.
if command -v flock >/dev/null; then
    exec 9>"$cache/.lock"
    flock 9
    installed && exit 0
fi

command -v apt-get >/dev/null || unavailable "apt-get not found (needs a Debian or Ubuntu host)"
[[ -n $mirror ]] || unavailable "no Debian archive in this machine's apt sources; set NSYS_DEBIAN_MIRROR"
command -v dpkg-deb >/dev/null || unavailable "dpkg-deb not found"
[[ -r $keyring ]] || unavailable "keyring $keyring is missing (package debian-archive-keyring)"
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)

apt_dir=$cache/apt
debs=$cache/debs
mkdir -p "$apt_dir"/{sources.list.d,preferences.d,state/lists/partial,cache/archives/partial,log} "$debs"
: >"$apt_dir/state/status"
echo "deb [signed-by=$keyring] $mirror $suite main non-free" >"$apt_dir/sources.list"

# Every Dir:: apt would read or write points into $apt_dir; the system's apt.conf.d is
# still read so that a configured proxy keeps working. As root apt would drop to the
# _apt user, which cannot write into a private folder under $HOME: stay as ourselves.
apt_opts=(
    -o "Dir::Etc::SourceList=$apt_dir/sources.list"
    -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
    -o "Dir::Etc::Preferences=$apt_dir/preferences"
    -o "Dir::Etc::PreferencesParts=$apt_dir/preferences.d"
    -o "Dir::State=$apt_dir/state"
    -o "Dir::State::status=$apt_dir/state/status"
    -o "Dir::Cache=$apt_dir/cache"
    -o "Dir::Log=$apt_dir/log"
    -o "APT::Architecture=$arch"
    -o "APT::Architectures=$arch"
    -o "APT::Sandbox::User=$(id -un)"
    -o "Acquire::Languages=none"
    -q
)

missing=()
for pkg in "${packages[@]}"; do
    compgen -G "$debs/${pkg}_*.deb" >/dev/null || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if ! log=$(apt-get "${apt_opts[@]}" update 2>&1); then
        unavailable "apt-get update of $mirror $suite failed: ${log//$'\n'/ | }"
    fi
    # apt-get update only warns when the mirror is unreachable; say so if download fails.
    fetch_errors=$(grep -E '^(Err|W|E):' <<<"$log" || true)
    if ! log=$(cd "$debs" && apt-get "${apt_opts[@]}" download "${missing[@]}" 2>&1); then
        log="$fetch_errors"$'\n'"$log"
        unavailable "apt-get download ${missing[*]} failed: ${log//$'\n'/ | }"
    fi
fi

# Unpack into a fresh folder and move it into place last, so that an interrupted run
# or two runs at once never leave a half-unpacked tree behind the stamp.
staging=$(mktemp -d "$cache/root.XXXXXX")
trap 'rm -rf "$staging"' EXIT
for pkg in "${packages[@]}"; do
    for deb in "$debs/${pkg}"_*.deb; do
        dpkg-deb -x "$deb" "$staging"
    done
done

nsys=""
for candidate in "$staging"/usr/bin/nsys "$staging"/usr/lib/nsight-systems/bin/nsys; do
    if [[ -x $candidate ]]; then
        nsys=$candidate
        break
    fi
done
if [[ -z $nsys ]]; then
    nsys=$(find "$staging" -name nsys -type f -perm -u+x -print -quit)
fi
[[ -n $nsys ]] || { echo "install_nsys: no nsys binary in ${packages[*]}" >&2; exit 1; }

# Debian splits the tool: nsys itself lives in target-linux-x64 under the multiarch
# folder, the report importer in host-linux-x64 under /usr/lib/nsight-systems. nsys looks
# for the importer next to its own real path, so without this link it leaves raw .qdstrm
# files ("The importer binary and its dependencies were not found").
target_dir=$(dirname "$(readlink -f "$nsys")")
for host_dir in "$staging"/usr/lib/nsight-systems/host-linux-*; do
    link=$(dirname "$target_dir")/$(basename "$host_dir")
    [[ -e $link ]] || ln -s "$(realpath --relative-to="$(dirname "$target_dir")" "$host_dir")" "$link"
    importer=$host_dir/QdstrmImporter
    if ! log=$("$importer" --version 2>&1); then
        unavailable "the report importer does not run here: ${log//$'\n'/ | }"
    fi
done

rm -rf "$root"
mv "$staging" "$root"
trap - EXIT
nsys=$root${nsys#"$staging"}
echo "$nsys" >"$stamp"
echo "$nsys"
