#!/bin/sh
# Removes the virtualenvs (under the folder given) whose checkout no longer exists, so clones
# that come and go (CI makes a fresh one per run) do not fill the cache directory.
set -eu
dir=$1
for venv in "$dir"/*/; do
    [ -f "$venv.checkout" ] || continue
    checkout=$(cat "$venv.checkout")
    if [ ! -f "$checkout/pyproject.toml" ]; then
        echo "removing the virtualenv of $checkout (the checkout is gone)"
        rm -rf "$venv"
    fi
done
