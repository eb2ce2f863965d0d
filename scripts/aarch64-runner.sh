#!/bin/sh
# Cargo's runner for aarch64-unknown-linux-gnu programs (.cargo/config.toml): qemu-user with the
# Debian/Ubuntu cross C library on any other host, the program itself on an aarch64 host.
case "$(uname -m)" in
aarch64 | arm64) exec "$@" ;;
*) exec qemu-aarch64 -L /usr/aarch64-linux-gnu "$@" ;;
esac
