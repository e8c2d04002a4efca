# Helpers for carrying a built extension from one device call to the next, sourced by
# ci/gpu_session.sh and ci/ab.sh. A file the device tool hands back holds at most 16 MiB, and the
# xz-compressed extension is more (18 MB at 542223c, xz -9e), so it travels in pieces of 15 MB:
# NAME.xz.00, NAME.xz.01, ... (a single NAME.xz from an earlier call is read as well).

# src_hash: the hash of the sources a build comes from (engine/csrc, engine/_build.py); a carried
# build is used only where it matches.
src_hash() {
  find engine/csrc engine/_build.py -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' \
    -o -name '*.cpp' -o -name '*.py' \) | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16
}

# pack_so SO PREFIX: SO compressed into the pieces PREFIX.xz.00, PREFIX.xz.01, ...
pack_so() {
  xz -T0 -6 -c "$1" | split -b 15000000 -d - "$2.xz."
}

# unpack_so PREFIX DEST: the pieces PREFIX.xz.NN (or one PREFIX.xz) decompressed into DEST.
unpack_so() {
  if [ -f "$1.xz" ]; then xz -dc "$1.xz"; else cat "$1".xz.[0-9][0-9] | xz -dc; fi > "$2"
}

# carried_prefixes FILE...: the PREFIXes of the given pieces, once each (nothing for no files).
carried_prefixes() {
  for f in "$@"; do [ -f "$f" ] && echo "$f"; done | sed -E 's/\.xz(\.[0-9]+)?$//' | sort -u
}
