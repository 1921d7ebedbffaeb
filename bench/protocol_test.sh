#!/bin/sh
# Runs bench/protocol_test.py (the run protocol's rules) with Debian's Python.
exec /usr/bin/python3 bench/protocol_test.py
