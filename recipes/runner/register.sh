#!/bin/sh
# Register this V100 box as pinwheel's self-hosted GitHub Actions runner and
# run it as a systemd service with the environment the cards need.
#
#   RUNNER_TOKEN=<registration token> recipes/runner/register.sh \
#       --repo OWNER/REPO --runner-dir /opt/actions-runner [options]
#
# The token comes from the repository's Settings > Actions > Runners > New
# self-hosted runner; it is read from the environment and never printed.
# --runner-dir holds GitHub's actions-runner release, unpacked (see README.md).
#
# Options:
#   --name NAME          runner name (default: this host's name)
#   --user USER          account the service runs as (default: the caller)
#   --manifest PATH      manifest whose [build].runner_labels are used (default: ./manifest.toml)
#   --cuda-home DIR      CUDA 12.x toolkit (default: $CUDA_HOME or /usr/local/cuda-12.4)
#   --data-dir DIR       caches: pinwheel, Triton, TileLang, inductor, vLLM, HF (default: /var/lib/pinwheel)
#   --model-dir DIR      the model pack to qualify with (default: DATA_DIR/model)
#   --etc DIR            where runner.env goes (default: /etc/pinwheel)
#   --systemd-dir DIR    where the unit goes (default: /etc/systemd/system)
#   --dry-run            write the env file and unit, print what would run; register nothing
# Environment: SYSTEMCTL (default: systemctl).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo_root=$(cd "$here/../.." && pwd)

die() {
    echo "register.sh: $1" >&2
    [ -n "${2:-}" ] && echo "  next: $2" >&2
    exit 2
}

repo="" runner_dir="" name=$(hostname) user=$(id -un) manifest=manifest.toml
cuda_home=${CUDA_HOME:-/usr/local/cuda-12.4} data_dir=/var/lib/pinwheel model_dir=""
etc=/etc/pinwheel systemd_dir=/etc/systemd/system dry_run=0
while [ $# -gt 0 ]; do
    case $1 in
        --repo) repo=$2; shift 2 ;;
        --runner-dir) runner_dir=$2; shift 2 ;;
        --name) name=$2; shift 2 ;;
        --user) user=$2; shift 2 ;;
        --manifest) manifest=$2; shift 2 ;;
        --cuda-home) cuda_home=$2; shift 2 ;;
        --data-dir) data_dir=$2; shift 2 ;;
        --model-dir) model_dir=$2; shift 2 ;;
        --etc) etc=$2; shift 2 ;;
        --systemd-dir) systemd_dir=$2; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) die "unknown option $1" "recipes/runner/register.sh --help" ;;
    esac
done
[ -n "$repo" ] || die "--repo OWNER/REPO is required" "pass the repository the runner serves"
[ -n "$runner_dir" ] || die "--runner-dir is required" "unpack GitHub's actions-runner there (README.md)"
case $repo in */*) ;; *) die "--repo must be OWNER/REPO, got '$repo'" "e.g. --repo acme/pinwheel" ;; esac
[ -n "$model_dir" ] || model_dir=$data_dir/model
runner_dir=$(cd "$runner_dir" 2>/dev/null && pwd) || die "no runner dir $runner_dir" "create it and unpack the runner there"
[ -f "$manifest" ] || die "no manifest at $manifest" "run from the pinwheel checkout or pass --manifest"
[ -x "$cuda_home/bin/nvcc" ] || [ "$dry_run" = 1 ] ||
    die "no nvcc under $cuda_home" "install CUDA 12.x (sm_70 needs 12.x) or pass --cuda-home"

# The runner's labels are the manifest's [build].runner_labels, so the release
# and qualify workflows (which read the same table) find this box.
labels=$(python3 - "$manifest" <<'PY'
import sys
try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib
with open(sys.argv[1], "rb") as f:
    labels = tomllib.load(f).get("build", {}).get("runner_labels", [])
if not labels:
    sys.exit(f"{sys.argv[1]}: [build] has no runner_labels")
# GitHub gives every self-hosted Linux x64 runner these three; register the rest.
print(",".join(l for l in labels if l.lower() not in ("self-hosted", "linux", "x64")))
PY
) || die "could not read [build].runner_labels from $manifest" "add runner_labels to [build]"
[ -n "$labels" ] || die "[build].runner_labels names no custom label" 'e.g. ["self-hosted", "linux", "x64", "v100"]'

render() {  # render TEMPLATE DEST: fill the @NAME@ placeholders
    sed -e "s|@RUNNER_NAME@|$name|g" -e "s|@RUNNER_USER@|$user|g" \
        -e "s|@RUNNER_DIR@|$runner_dir|g" -e "s|@REPO_ROOT@|$repo_root|g" \
        -e "s|@ENV_FILE@|$etc/runner.env|g" -e "s|@CUDA_HOME@|$cuda_home|g" \
        -e "s|@DATA_DIR@|$data_dir|g" -e "s|@MODEL_DIR@|$model_dir|g" "$1" > "$2.tmp"
    mv "$2.tmp" "$2"
}

mkdir -p "$etc" "$systemd_dir"
if [ -f "$etc/runner.env" ]; then
    echo "keeping $etc/runner.env (delete it to re-create it from the template)"
else
    render "$here/runner.env.in" "$etc/runner.env"
    echo "wrote $etc/runner.env"
fi
unit=pinwheel-runner-$name.service
render "$here/pinwheel-runner.service.in" "$systemd_dir/$unit"
echo "wrote $systemd_dir/$unit"
echo "labels: self-hosted,linux,x64,$labels"

as_user() {  # config.sh refuses to run as root; run it as the service user
    if [ "$(id -un)" = "$user" ]; then "$@"; else sudo -u "$user" -- "$@"; fi
}

if [ "$dry_run" = 1 ]; then
    echo "would run: $runner_dir/config.sh --unattended --replace --url https://github.com/$repo" \
        "--token *** --name $name --labels $labels --work _work"
    echo "would run: ${SYSTEMCTL:-systemctl} daemon-reload && ${SYSTEMCTL:-systemctl} enable --now $unit"
    exit 0
fi
[ -n "${RUNNER_TOKEN:-}" ] || die "RUNNER_TOKEN is not set" "export the registration token from Settings > Actions > Runners"
[ -x "$runner_dir/config.sh" ] || die "no config.sh in $runner_dir" "unpack GitHub's actions-runner release there"
mkdir -p "$data_dir" "$model_dir"
[ "$(id -u)" != 0 ] || chown "$user" "$data_dir" "$model_dir"  # the jobs write the caches

as_user "$runner_dir/config.sh" --unattended --replace --url "https://github.com/$repo" \
    --token "$RUNNER_TOKEN" --name "$name" --labels "$labels" --work _work
${SYSTEMCTL:-systemctl} daemon-reload
${SYSTEMCTL:-systemctl} enable --now "$unit"
echo "runner $name registered and started; check it with: $here/health-check.sh"
