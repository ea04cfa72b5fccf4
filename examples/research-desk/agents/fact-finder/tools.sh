#!/usr/bin/env bash
set -e
# The fact-finder's tools: search and read the notes in ./archive/.
# @env LLM_OUTPUT=/dev/stdout The output path

# @cmd Search the archive: the notes whose text mentions every word of the query
# @option --query! Words to look for (case-insensitive)
search_archive() {
  cd "$LLM_AGENT_ROOT_DIR/archive"
  matches=()
  for note in *.md; do
    hit=1
    for word in $argc_query; do
      grep -qi -- "$word" "$note" || { hit=0; break; }
    done
    if [ "$hit" = 1 ]; then matches+=("$note: $(head -n 1 "$note" | sed 's/^# //')"); fi
  done
  if [ ${#matches[@]} -eq 0 ]; then
    echo "no notes mention: $argc_query" >> "$LLM_OUTPUT"
  else
    printf '%s\n' "${matches[@]}" >> "$LLM_OUTPUT"
  fi
}

# @cmd Read one note of the archive
# @option --name! The note's file name, as search_archive lists it
read_note() {
  case "$argc_name" in
    */*|..*) echo "error: give a file name from search_archive" >&2; exit 1 ;;
  esac
  cat "$LLM_AGENT_ROOT_DIR/archive/$argc_name" >> "$LLM_OUTPUT"
}

eval "$(argc --argc-eval "$0" "$@")"
