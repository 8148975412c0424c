#!/usr/bin/env bash
# Test the Debian package on this machine, as an operator installs it:
#
#   1. build it (scripts/build-deb.sh; the dev profile, which builds in a fraction of the
#      release build's time: PMNET_PACKAGE_PROFILE=release for the release build);
#   2. install it with `dpkg -i` into this system (root needed: CI runs as root), and check
#      the user pmnet, /var/lib/pmnet, the man page (`man -l`), the bash completion (`bash -n`)
#      and the units (`systemd-analyze verify`, where there is one);
#   3. start pmnet-server@local and pmnet-device@local: with systemctl when systemd runs, else
#      as the unit says — its ExecStart= with %i = local, run as its User= (runuser) in its
#      WorkingDirectory= with $STATE_DIRECTORY set, in the background;
#   4. `pmnet client --device 127.0.0.1:7400 set k v` must print OK and `get k` give v;
#   5. stop them (each must exit cleanly), `dpkg --purge pmnet`, and check that the user, the
#      group, /var/lib/pmnet, /etc/pmnet and every installed file are gone.
#
# Whatever happens, the services are stopped and the package purged on exit. It refuses to
# run where pmnet is installed already, or where a user pmnet or a non-empty /var/lib/pmnet
# exists that the package did not make (its purge would delete them); in CI (CI=true) a
# non-empty /var/lib/pmnet is moved aside for the test and put back after it. The samples' ports
# (7400, 7500, 9400, 9500 on loopback) must be free. If target/release/pmnet exists, its size
# is checked too (at most 20 MB). Exit status 0 only if everything passed; 77 when it cannot
# run at all (not root, and no password-less sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n--> %s\n' "$*"; }
fail() {
    printf 'test-package: FAILED: %s\n' "$*" >&2
    exit 1
}

if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        exec sudo -n --preserve-env=PATH,CARGO_TARGET_DIR,PMNET_PACKAGE_PROFILE,RUSTUP_HOME,CARGO_HOME "$0" "$@"
    fi
    echo "test-package: skipped: it installs a package; run it as root (or with password-less sudo)" >&2
    exit 77
fi
for tool in dpkg dpkg-deb runuser getent; do
    command -v "$tool" >/dev/null 2>&1 || fail "needs $tool"
done

started=$(date +%s)
profile="${PMNET_PACKAGE_PROFILE:-dev}"
log_dir="$(mktemp -d)"
installed=false
state_existed_empty=false
moved_state=""
declare -A pids=() runuser_of=()

cleanup() {
    local status=$?
    set +e
    for unit in "${!pids[@]}"; do
        local pid="${pids[$unit]}"
        if kill -0 "$pid" 2>/dev/null; then
            echo "cleanup: stopping $unit (pid $pid)"
            kill -TERM "$pid" 2>/dev/null
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$pid" 2>/dev/null
        fi
    done
    if [ -d /run/systemd/system ] && $installed; then
        systemctl stop pmnet-device@local pmnet-server@local 2>/dev/null
    fi
    if $installed; then
        echo "cleanup: dpkg --purge pmnet"
        dpkg --purge pmnet >/dev/null 2>&1
    fi
    if $state_existed_empty && [ ! -e /var/lib/pmnet ]; then
        install -d -m 0750 /var/lib/pmnet
    fi
    if [ -n "$moved_state" ] && [ -d "$moved_state" ]; then
        rm -rf /var/lib/pmnet
        mv "$moved_state" /var/lib/pmnet
        echo "cleanup: /var/lib/pmnet put back"
    fi
    if [ "$status" -ne 0 ]; then
        for log in "$log_dir"/*.log; do
            [ -f "$log" ] || continue
            echo "--- $(basename "$log") (last 20 lines)"
            tail -n 20 "$log"
        done
    fi
    rm -rf "$log_dir"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "preconditions: no pmnet installed, no user pmnet or state the package did not make, free ports"
if dpkg-query -W -f='${Status}' pmnet 2>/dev/null | grep -q 'installed'; then
    fail "the package pmnet is installed here already; this test would purge it"
fi
if getent passwd pmnet >/dev/null || getent group pmnet >/dev/null; then
    fail "a user or group pmnet exists; this test's purge would delete it"
fi
if [ -d /var/lib/pmnet ]; then
    if [ -n "$(ls -A /var/lib/pmnet)" ]; then
        if [ "${CI:-}" != true ]; then
            fail "/var/lib/pmnet holds files (a root process's state?); this test's purge would delete them"
        fi
        # In CI the machine is the test's: keep them aside, and put them back afterwards.
        moved_state="/var/lib/pmnet.before-package-test.$$"
        mv /var/lib/pmnet "$moved_state"
        echo "CI: /var/lib/pmnet held files ($(ls -A "$moved_state" | tr '\n' ' ')); moved to $moved_state for the test, put back after it"
    else
        state_existed_empty=true
    fi
fi
for port in 7400 7500; do
    if ss -Hlun "sport = :$port" 2>/dev/null | grep -q .; then fail "UDP port $port is in use"; fi
done
for port in 9400 9500; do
    if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then fail "TCP port $port is in use"; fi
done

say "build the package (scripts/build-deb.sh --profile $profile)"
deb="$(scripts/build-deb.sh --profile "$profile" --out "${CARGO_TARGET_DIR:-target}/debian" | tail -n 1)"
[ -f "$deb" ] || fail "build-deb.sh made no package"
deb_bytes=$(stat -c %s "$deb")
echo "package: $deb ($deb_bytes bytes)"
dpkg-deb --info "$deb" | sed -n 's/^ \(Version\|Depends\|Installed-Size\):/  \1:/p'

release="${CARGO_TARGET_DIR:-target}/release/pmnet"
if [ -f "$release" ]; then
    release_bytes=$(stat -c %s "$release")
    echo "release binary: $release ($release_bytes bytes, $(date -r "$release" '+built %F %T'))"
    [ "$release_bytes" -le 20000000 ] || fail "$release is larger than 20 MB"
else
    echo "release binary: none built ($release); its size is not checked"
fi

say "dpkg -i $(basename "$deb")"
installed=true
dpkg -i "$deb"

say "check the installation"
/usr/bin/pmnet --version
getent passwd pmnet | grep -q ':/var/lib/pmnet:' || fail "no system user pmnet with home /var/lib/pmnet"
getent group pmnet >/dev/null || fail "no group pmnet"
[ "$(stat -c %U:%G /var/lib/pmnet)" = pmnet:pmnet ] || fail "/var/lib/pmnet is not owned by pmnet"
echo "user: $(getent passwd pmnet); /var/lib/pmnet: $(stat -c '%U:%G %a' /var/lib/pmnet)"
for conffile in device server gateway redis-adaptor controller memnode; do
    dpkg-query -W -f='${Conffiles}\n' pmnet | grep -q "/etc/pmnet/$conffile-local.toml" ||
        fail "/etc/pmnet/$conffile-local.toml is not a conffile"
done
echo "conffiles: $(dpkg-query -W -f='${Conffiles}\n' pmnet | awk 'NF { print $1 }' | tr '\n' ' ')"
[ -f /usr/lib/pmnet/libpmnet_redis_module.so ] || fail "no Redis module in /usr/lib/pmnet"
bash -n /usr/share/bash-completion/completions/pmnet || fail "bash -n rejects the bash completion"
echo "bash completion: bash -n accepts it"
grep -q '^#compdef pmnet' /usr/share/zsh/vendor-completions/_pmnet || fail "the zsh completion"
grep -q 'complete -c pmnet' /usr/share/fish/vendor_completions.d/pmnet.fish || fail "the fish completion"
if command -v man >/dev/null 2>&1; then
    MANWIDTH=100 man -l /usr/share/man/man1/pmnet.1.gz >"$log_dir/man.txt" 2>&1 ||
        fail "man -l pmnet.1.gz: $(cat "$log_dir/man.txt")"
    grep -q 'pmnet-device(1)' "$log_dir/man.txt" || fail "pmnet(1) names no pmnet-device(1)"
    MANWIDTH=100 man -l /usr/share/man/man1/pmnet-device.1.gz | grep -q -- '--log-file' ||
        fail "pmnet-device(1) names no --log-file"
    echo "man pages: man -l renders pmnet.1.gz ($(wc -l <"$log_dir/man.txt") lines) and pmnet-device.1.gz"
else
    echo "man pages: no man here; not rendered"
fi
if command -v systemd-analyze >/dev/null 2>&1; then
    mkdir "$log_dir/units"
    for command in device server gateway redis-adaptor controller memnode; do
        cp "/lib/systemd/system/pmnet-$command@.service" "$log_dir/units/pmnet-$command@local.service"
    done
    if ! systemd-analyze verify --man=no "$log_dir"/units/*.service >"$log_dir/verify.log" 2>&1; then
        cat "$log_dir/verify.log"
        fail "systemd-analyze verify rejects a unit"
    fi
    echo "units: systemd-analyze verify accepts the six (instance local)"
else
    echo "units: no systemd-analyze here; not verified"
fi

units=(pmnet-server@local pmnet-device@local)
if [ -d /run/systemd/system ]; then
    say "systemd runs: systemctl start ${units[*]}"
    systemctl daemon-reload
    systemctl start "${units[@]}"
    systemctl --no-pager status "${units[@]}" | head -n 20
else
    say "no systemd (no /run/systemd/system): start ${units[*]} as their units say"
    for unit in "${units[@]}"; do
        template="${unit%@*}@.service"
        instance="${unit#*@}"
        file="/lib/systemd/system/$template"
        exec_start="$(sed -n 's/^ExecStart=//p' "$file")"
        user="$(sed -n 's/^User=//p' "$file")"
        dir="$(sed -n 's/^WorkingDirectory=//p' "$file")"
        state="/var/lib/$(sed -n 's/^StateDirectory=//p' "$file")"
        umask_value="$(sed -n 's/^UMask=//p' "$file")"
        [ -n "$exec_start" ] && [ -n "$user" ] || fail "$file: no ExecStart= or User="
        read -r -a argv <<<"${exec_start//%i/$instance}"
        # What systemd does for StateDirectory=: the directory, owned by the user.
        install -d -o "$user" -g "$user" -m 0750 "$state"
        echo "$unit: (cd ${dir:-/}; umask ${umask_value:-0022}; runuser -u $user -- env STATE_DIRECTORY=$state ${argv[*]}) &"
        (cd "${dir:-/}" && umask "${umask_value:-0022}" && exec runuser -u "$user" -- env STATE_DIRECTORY="$state" \
            CONFIGURATION_DIRECTORY=/etc/pmnet "${argv[@]}") >"$log_dir/$unit.log" 2>&1 &
        runuser_pid=$!
        # runuser stays the parent of the command: signal the command itself.
        pid=""
        for _ in $(seq 50); do
            pid="$(pgrep -P "$runuser_pid" | head -n 1 || true)"
            [ -n "$pid" ] && break
            sleep 0.1
        done
        [ -n "$pid" ] || fail "$unit did not start: $(cat "$log_dir/$unit.log")"
        pids[$unit]=$pid
        runuser_of[$unit]=$runuser_pid
        echo "$unit: pid $pid, user $(ps -o user= -p "$pid")"
    done
fi

say "pmnet client --device 127.0.0.1:7400 set k v; get k"
reply=""
for _ in $(seq 100); do
    reply="$(/usr/bin/pmnet client --device 127.0.0.1:7400 set k v 2>&1)" && [[ "$reply" == OK* ]] && break
    sleep 0.2
done
echo "set k v: $reply"
[[ "$reply" == OK* ]] || fail "set k v did not print OK"
value="$(/usr/bin/pmnet client --device 127.0.0.1:7400 get k)"
echo "get k: $value"
# (A read's line may say who answered it: "v (from server 1)".)
[ "${value%% (*}" = v ] || fail "get k gave '$value', not v"
/usr/bin/pmnet status 127.0.0.1:9400 | head -n 3
ls -l /var/lib/pmnet
[ "$(stat -c %U /var/lib/pmnet/pmnet-device-1.log)" = pmnet ] || fail "the device's log is not in /var/lib/pmnet, owned by pmnet"
[ "$(stat -c %U /var/lib/pmnet/pmnet-server-1.data)" = pmnet ] || fail "the server's store is not in /var/lib/pmnet, owned by pmnet"

say "stop the services"
if [ -d /run/systemd/system ]; then
    systemctl stop "${units[@]}"
else
    for unit in pmnet-device@local pmnet-server@local; do
        pid="${pids[$unit]}"
        kill -TERM "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && fail "$unit did not stop within 10 s of SIGTERM"
        unset "pids[$unit]"
        # runuser exits with the command's status.
        status=0
        wait "${runuser_of[$unit]}" || status=$?
        [ "$status" -eq 0 ] || fail "$unit exited with status $status after SIGTERM"
        echo "$unit: stopped cleanly"
    done
fi

say "dpkg --purge pmnet"
dpkg --purge pmnet
installed=false
leftovers=()
getent passwd pmnet >/dev/null && leftovers+=("the user pmnet")
getent group pmnet >/dev/null && leftovers+=("the group pmnet")
for path in /var/lib/pmnet /etc/pmnet /usr/bin/pmnet /usr/share/doc/pmnet \
    /usr/share/man/man1/pmnet.1.gz /usr/share/bash-completion/completions/pmnet /usr/lib/pmnet \
    /lib/systemd/system/pmnet-device@.service; do
    [ -e "$path" ] && leftovers+=("$path")
done
[ ${#leftovers[@]} -eq 0 ] || fail "left after purge: ${leftovers[*]}"
echo "purged: no user, group, state, configuration or file of the package is left"

echo
echo "test-package: passed in $(($(date +%s) - started)) s (package $deb_bytes bytes)"
