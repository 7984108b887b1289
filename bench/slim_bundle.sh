#!/usr/bin/env bash
# Trim a GPU bundle (.gpu/site.tar.xz, the pinned site-packages the bare GPU image lacks) to what a device call
# runs, so that it travels with the working tree and the peer wheels under the 64 MiB a call carries:
#   - openai (and jiter, distro): the LLM agent's client, imported only when an endpoint is configured;
#   - ray's libraries above the core (data, train, tune, air): nothing in the project imports them;
#   - great_expectations' data-docs images and fonts (render/view/static): the warehouse's checks never render;
#   - Prefect's UI bundle (server/ui-v2) and apprise (its notification blocks): a device call runs its flows headless,
#     and the server mounts the UI only where the bundle is present.
#
#   bash bench/slim_bundle.sh .gpu/site.tar.xz          # rewrites it in place (about 2 minutes on 2 cores)
set -euo pipefail
bundle=${1:?usage: bash bench/slim_bundle.sh BUNDLE.tar.xz}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xJf "$bundle" -C "$work"
before=$(stat -c %s "$bundle")
(cd "$work" && rm -rf openai openai-*.dist-info jiter jiter-*.dist-info distro distro-*.dist-info \
    ray/data ray/train ray/tune ray/air great_expectations/render/view/static \
    prefect/server/ui-v2 prefect/server/ui apprise apprise-*.dist-info)
tar -C "$work" -cf - . | xz -9e -T2 > "$bundle.tmp" && mv "$bundle.tmp" "$bundle"
echo "$bundle: $before -> $(stat -c %s "$bundle") bytes"
