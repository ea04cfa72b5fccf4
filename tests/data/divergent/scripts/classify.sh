#!/usr/bin/env bash
echo '{"label": "invoice-7", "category": "finance"}'
