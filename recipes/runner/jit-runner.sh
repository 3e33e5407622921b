#!/bin/sh
# One GitHub Actions job per runner, a fresh workspace each time: the loop the
# pinwheel-runner service runs (register.sh writes the unit).
#
#   jit-runner.sh --scope orgs/ORG|repos/OWNER/REPO --runner-dir DIR --user USER \
#       --name NAME --labels v100[,more] [--group-id N] [--api URL] [--once]
#
# Each round: wipe the runner's work folder and state, ask GitHub for a just-in-time
# runner configuration (POST <api>/<scope>/actions/runners/generate-jitconfig: one
# runner, one job, deleted by GitHub afterwards), run `run.sh --jitconfig` as USER,
# wipe again. The GitHub token that may create runners is read from
# $CREDENTIALS_DIRECTORY/github-token (systemd LoadCredential=, readable by this
# service only) or --token-file; it never reaches the job, its environment, a
# command line or the log. Without a token, or when GitHub refuses, it says so and
# retries after --retry seconds (default 60; --once: exits 2).
set -eu

die() {
    echo "jit-runner.sh: $1" >&2
    [ -n "${2:-}" ] && echo "  next: $2" >&2
    exit 2
}

scope="" runner_dir="" user=$(id -un) name=$(hostname) labels="" group_id=1
api=https://api.github.com token_file="" once=0 retry=60
while [ $# -gt 0 ]; do
    case $1 in
        --scope) scope=$2; shift 2 ;;
        --runner-dir) runner_dir=$2; shift 2 ;;
        --user) user=$2; shift 2 ;;
        --name) name=$2; shift 2 ;;
        --labels) labels=$2; shift 2 ;;
        --group-id) group_id=$2; shift 2 ;;
        --api) api=$2; shift 2 ;;
        --token-file) token_file=$2; shift 2 ;;
        --retry) retry=$2; shift 2 ;;
        --once) once=1; shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) die "unknown option $1" "recipes/runner/jit-runner.sh --help" ;;
    esac
done
# Every value below reaches a URL, a JSON body or a path: only plain spellings.
case $scope in
    orgs/*/*|repos/*/*/*) die "--scope $scope has too many parts" "orgs/ORG or repos/OWNER/REPO" ;;
    orgs/?*|repos/?*/?*) ;;
    *) die "--scope must be orgs/ORG or repos/OWNER/REPO, got '$scope'" "e.g. --scope orgs/acme" ;;
esac
for value in "$scope" "$name" "$labels" "$user"; do
    case $value in
        *[!A-Za-z0-9._/,-]*|-*|*/-*|*,-*|'') die "'$value' holds characters this script does not pass on" \
            "use letters, digits, '.', '_', '-' (and ',' between labels)" ;;
    esac
done
case $group_id in ''|*[!0-9]*) die "--group-id must be a number, got '$group_id'" "see README.md" ;; esac
case $retry in ''|*[!0-9]*) die "--retry must be a number of seconds" "" ;; esac
[ -n "$runner_dir" ] && [ -x "$runner_dir/run.sh" ] ||
    die "no run.sh in '$runner_dir'" "unpack GitHub's actions-runner release there (README.md)"
[ -n "$token_file" ] || token_file=${CREDENTIALS_DIRECTORY:-/nonexistent}/github-token

fresh() {  # the job's workspace and the runner's per-registration state: gone
    rm -rf "$runner_dir/_work" "$runner_dir/_diag" "$runner_dir/.runner" \
        "$runner_dir/.credentials" "$runner_dir/.credentials_rsaparams" "$runner_dir/.env"
}

jitconfig() {  # prints the encoded JIT configuration; the token travels on stdin
    [ -r "$token_file" ] || { echo "no GitHub token at $token_file" >&2; return 1; }
    body=$(python3 - "$name-$(date -u +%Y%m%d%H%M%S)-$$" "$labels" "$group_id" <<'PY'
import json, sys
name, labels, group = sys.argv[1], sys.argv[2], int(sys.argv[3])
print(json.dumps({"name": name, "runner_group_id": group,
                  "labels": ["self-hosted", *labels.split(",")], "work_folder": "_work"}))
PY
)
    answer=$( { printf 'header = "Authorization: Bearer %s"\n' "$(cat "$token_file")"
               printf 'header = "Accept: application/vnd.github+json"\n'
               printf 'header = "X-GitHub-Api-Version: 2022-11-28"\n'; } |
        curl --silent --show-error --fail --max-time 60 --config - -X POST \
            --data "$body" "$api/$scope/actions/runners/generate-jitconfig") || return 1
    printf '%s' "$answer" | python3 -c '
import json, sys
config = json.load(sys.stdin).get("encoded_jit_config")
if not isinstance(config, str) or not config.isprintable() or config.startswith("-"):
    sys.exit("GitHub answered without an encoded_jit_config")
print(config)'
}

as_user() {  # the job runs as the service user, with none of this script's credentials
    if [ "$(id -un)" = "$user" ]; then
        env -u CREDENTIALS_DIRECTORY "$@"
    else
        runuser -u "$user" -- env -u CREDENTIALS_DIRECTORY "$@"
    fi
}

while :; do
    fresh
    if config=$(jitconfig); then
        echo "runner $name: waiting for one job ($scope, group $group_id, labels self-hosted,$labels)"
        rc=0
        (cd "$runner_dir" && as_user ./run.sh --jitconfig "$config") || rc=$?
        fresh
        echo "runner $name: job ended (run.sh exited $rc); workspace wiped"
    else
        fresh
        [ "$once" = 1 ] && die "could not get a JIT runner configuration from $api/$scope" \
            "check the token (Administration or organization self-hosted runners: write) and the scope"
        echo "runner $name: no JIT configuration from $api/$scope; retrying in ${retry}s" >&2
        sleep "$retry"
        continue
    fi
    [ "$once" = 1 ] && exit "$rc"
done
