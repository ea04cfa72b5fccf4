#!/bin/sh
# Tools the browser and picture tests use, installed when missing:
#   chromium, graphviz  Debian packages (installed with apt-get when run as root)
#   openssh-client      ssh-keygen and ssh-agent, for the signed-decision tests
#   mermaid             the Mermaid parser (npm) under .venv/node/mermaid
# Without them the tests that need them are skipped or fail, saying which one is missing.
set -u
missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
command -v dot >/dev/null 2>&1 || missing="$missing graphviz"
command -v ssh-keygen >/dev/null 2>&1 || missing="$missing openssh-client"
command -v unshare >/dev/null 2>&1 || missing="$missing util-linux"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    # A new machine's package lists may be empty or old: refresh them once on failure.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null; } \
      || echo "note: could not install$missing; the tests that need them will say so"
  else
    echo "note:$missing missing (install as root: apt-get install -y$missing)"
  fi
fi
if [ ! -f .venv/node/mermaid/node_modules/mermaid/dist/mermaid.min.js ]; then
  if command -v npm >/dev/null 2>&1; then
    npm install --silent --no-audit --no-fund --prefix .venv/node/mermaid mermaid@11 >/dev/null 2>&1 \
      || echo "note: mermaid not installed; the Mermaid parser test will be skipped"
  fi
fi
exit 0
