#!/bin/sh
# Tools the browser and picture tests use, installed when missing:
#   chromium, graphviz  Debian packages (installed with apt-get when run as root)
#   mermaid             the Mermaid parser (npm) under .venv/node/mermaid
# Without them those tests are skipped, saying which one is missing.
set -u
missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
command -v dot >/dev/null 2>&1 || missing="$missing graphviz"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null \
      || echo "note: could not install$missing; browser/picture tests will be skipped"
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
