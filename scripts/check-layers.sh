#!/usr/bin/env bash
# Folder dependencies point one way (docs/architecture.md, "Folders"): fails, naming the file
# and the include, when
#   - a public header (any */include/) includes something that is not a public header;
#   - a folder of sidecar/src includes a folder it may not (the allowed edges are below: net,
#     cuda, fabric, metrics and cluster stand alone; transport uses net and cuda; peer uses net and the
#     seam, transport/set.hpp; the engine's files at the top of sidecar/src use them all);
#   - a library other than the sidecar (config, ipc, cuda, shim) includes sidecar internals.
# Run by scripts/test.sh and as the CTest `layering`.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bad=0
fail() {
    echo "check-layers: $*" >&2
    bad=1
}

# 1. Public headers include only public headers (and system ones).
while IFS=: read -r file line text; do
    fail "$file:$line: a public header includes a private one: $text"
done < <(grep -rnE '^#include "' --include='*.h' --include='*.hpp' \
    config/include ipc/include cuda/include shim/include sidecar/include |
    grep -vE ':#include "tensorlane/' || true)

# 2. sidecar/src's folders.
declare -A allowed=(
    [net]=""
    [cuda]=""
    [fabric]=""
    [metrics]=""
    [cluster]=""
    [transport]="net cuda"
    [peer]="net transport"
)
for dir in sidecar/src/*/; do
    name=$(basename "$dir")
    if [ -z "${allowed[$name]+set}" ]; then
        fail "sidecar/src/$name/ is not in this script's table: add its allowed edges"
        continue
    fi
    while IFS=: read -r file line text; do
        target=$(printf '%s' "$text" | sed -E 's|#include "([a-z_]+)/.*|\1|')
        [ "$target" = "$name" ] && continue
        [ "$target" = tensorlane ] && continue
        [ -d "sidecar/src/$target" ] || continue  # not a folder of sidecar/src
        case " ${allowed[$name]} " in
            *" $target "*) ;;
            *) fail "$file:$line: $name/ may not include $target/: $text" ;;
        esac
        # The peer layer knows transports through the seam only, never a transport's files.
        if [ "$name" = peer ] && [ "$target" = transport ] &&
            [ "$text" != '#include "transport/set.hpp"' ]; then
            fail "$file:$line: peer/ may include only transport/set.hpp of transport/: $text"
        fi
    done < <(grep -rnE '^#include "[a-z_]+/' "$dir" || true)
done

# 3. The other libraries never reach into the sidecar.
while IFS=: read -r file line text; do
    fail "$file:$line: includes the sidecar's internals: $text"
done < <(grep -rnE '^#include "(tensorlane/sidecar/|sidecar/|engine|peer/|transport/)' \
    config ipc cuda shim || true)

if [ "$bad" -ne 0 ]; then
    exit 1
fi
echo "check-layers: folder dependencies point one way"
