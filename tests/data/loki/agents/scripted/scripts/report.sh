#!/usr/bin/env bash
set -e
source "$LLM_PROMPT_UTILS_FILE"
guard_operation "Report?"
keys="$(env | grep -c '_API_KEY=' || true)"
report="root=$LLM_ROOT_DIR data=$LLM_AGENT_DATA_DIR confirm=$AUTO_CONFIRM keys=$keys $(loki-helper hi)"
printf '{"report": "%s"}\n' "$report"
