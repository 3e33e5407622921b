#!/bin/sh
# Make this GPU box pinwheel's self-hosted GitHub Actions runner: ephemeral, one
# job per just-in-time (JIT) runner, a fresh workspace each time, run by a systemd
# service with the environment the cards need.
#
#   recipes/runner/register.sh --org ORG --runner-group-id N \
#       --runner-dir /opt/actions-runner [options]        # or --repo OWNER/REPO
#
# Nothing is registered up front: the service (jit-runner.sh) asks GitHub for a
# JIT configuration before every job, with a token that may create runners. That
# token lives in --token-file (default /etc/pinwheel/github-token, mode 0400 or
# 0600, owned by root); systemd hands it to the service alone (LoadCredential=), never
# to a job. --runner-dir holds GitHub's actions-runner release, unpacked (README.md).
#
# Options:
#   --org ORG            an organization runner, in --runner-group-id's group (the group
#                        limits it to selected repositories and workflows; README.md)
#   --repo OWNER/REPO    a repository runner instead (no workflow restriction possible)
#   --runner-group-id N  the runner group (default 1: the Default group)
#   --token-file PATH    the GitHub token file (default: ETC/github-token)
#   --name NAME          runner name prefix (default: this host's name)
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

repo="" org="" group_id=1 token_file="" runner_dir="" name=$(hostname) user=$(id -un)
manifest=manifest.toml cuda_home=${CUDA_HOME:-/usr/local/cuda-12.4} data_dir=/var/lib/pinwheel
model_dir="" etc=/etc/pinwheel systemd_dir=/etc/systemd/system dry_run=0
while [ $# -gt 0 ]; do
    case $1 in
        --repo) repo=$2; shift 2 ;;
        --org) org=$2; shift 2 ;;
        --runner-group-id) group_id=$2; shift 2 ;;
        --token-file) token_file=$2; shift 2 ;;
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
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) die "unknown option $1" "recipes/runner/register.sh --help" ;;
    esac
done
[ -n "$runner_dir" ] || die "--runner-dir is required" "unpack GitHub's actions-runner there (README.md)"
if [ -n "$org" ] && [ -z "$repo" ]; then
    scope=orgs/$org
elif [ -n "$repo" ] && [ -z "$org" ]; then
    case $repo in */*) ;; *) die "--repo must be OWNER/REPO, got '$repo'" "e.g. --repo acme/pinwheel" ;; esac
    scope=repos/$repo
else
    die "pass exactly one of --org ORG and --repo OWNER/REPO" \
        "--org with a runner group limited to pinwheel's workflows (README.md)"
fi
case $group_id in ''|*[!0-9]*) die "--runner-group-id must be a number, got '$group_id'" \
    "gh api orgs/ORG/actions/runner-groups --jq '.runner_groups[] | [.id, .name]'" ;; esac
[ -n "$token_file" ] || token_file=$etc/github-token
for value in "$scope" "$name" "$user"; do  # they reach the unit, a URL and a JSON body
    case $value in
        *[!A-Za-z0-9._/-]*|-*|*/-*) die "'$value' holds characters the runner service does not take" \
            "use letters, digits, '.', '_' and '-'" ;;
    esac
done
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
        -e "s|@DATA_DIR@|$data_dir|g" -e "s|@MODEL_DIR@|$model_dir|g" \
        -e "s|@SCOPE@|$scope|g" -e "s|@GROUP_ID@|$group_id|g" -e "s|@LABELS@|$labels|g" \
        -e "s|@TOKEN_FILE@|$token_file|g" "$1" > "$2.tmp"
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

if [ "$dry_run" = 1 ]; then
    echo "would run: ${SYSTEMCTL:-systemctl} daemon-reload && ${SYSTEMCTL:-systemctl} enable --now $unit"
    echo "the service asks $scope for one JIT runner per job (group $group_id), token from $token_file"
    exit 0
fi
# The token: present, a regular file (not a link), and readable by its owner only.
[ -f "$token_file" ] && [ ! -L "$token_file" ] || die "no token file at $token_file" \
    "install -m 0400 /dev/stdin $token_file  (paste a token that may create runners; README.md)"
case $(stat -c %a "$token_file") in
    400|600) ;;
    *) die "$token_file is readable by others (mode $(stat -c %a "$token_file"))" "chmod 0400 $token_file" ;;
esac
[ -x "$runner_dir/run.sh" ] || die "no run.sh in $runner_dir" "unpack GitHub's actions-runner release there"
mkdir -p "$data_dir" "$model_dir"
[ "$(id -u)" != 0 ] || chown "$user" "$data_dir" "$model_dir" "$runner_dir"  # the jobs write there
${SYSTEMCTL:-systemctl} daemon-reload
${SYSTEMCTL:-systemctl} enable --now "$unit"
echo "runner service $unit started: one JIT runner per job; check the box with: $here/health-check.sh"
