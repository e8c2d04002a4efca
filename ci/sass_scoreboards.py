"""Which instructions of a kernel's loops wait on the scoreboards of the loop's 16-byte global
loads (NOTES Q75c): a prefetch issued at a loop's top is worthless where ptxas counts it on the
same scoreboard as the current row's loads and the first use of the current row waits on it.

Reads ``cuobjdump -sass`` output (sm_90), decodes each instruction's control bits (bits 105-127 of
the 128-bit word: stall 4, yield 1, write scoreboard 3, read scoreboard 3, wait mask 6), finds the
loops that contain LDG.E.128 loads (a backward branch's target up to the branch), and prints each
loop's 16-byte loads with their write scoreboard, then every later instruction of the loop whose
wait mask includes one of those scoreboards.

    cuobjdump -sass kernel.cubin > k.sass
    python3 ci/sass_scoreboards.py k.sass norm_fwd_fp8_lean_kernel [more name fragments]
"""

from __future__ import annotations

import re
import sys

INS = re.compile(r"\s*/\*([0-9a-f]{4,5})\*/\s+(.*?);\s*/\* (0x[0-9a-f]+) \*/")
HI = re.compile(r"\s*/\* (0x[0-9a-f]+) \*/")
BRA = re.compile(r"BRA (?:!?P\d, )?0x([0-9a-f]+)")


def decode(text: str):
    """(address, instruction, write scoreboard or None, wait scoreboards) per instruction."""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        m = INS.match(line)
        if not m or i + 1 >= len(lines):
            continue
        hi = HI.match(lines[i + 1])
        if not hi:
            continue
        ctrl = int(hi.group(1), 16) >> 41
        wb = (ctrl >> 5) & 7
        mask = (ctrl >> 11) & 0x3F
        out.append((int(m.group(1), 16), m.group(2).strip(), None if wb == 7 else wb,
                    [k for k in range(6) if mask >> k & 1]))
    return out


def report(name: str, ins) -> None:
    loads = [(a, wb) for a, s, wb, _ in ins if "LDG.E.128" in s]
    loops = []
    for a, s, _, _ in ins:
        m = BRA.search(s)
        if m and int(m.group(1), 16) < a:
            lo = int(m.group(1), 16)
            if any(lo <= la <= a for la, _ in loads):
                loops.append((lo, a))
    print(name)
    for lo, hi in loops:
        body = [x for x in ins if lo <= x[0] <= hi]
        ld = [(a, wb) for a, s, wb, _ in body if "LDG.E.128" in s]
        print(f"  loop {lo:#x}-{hi:#x}: 16-byte loads " + ", ".join(f"{a:#x} sb{wb}" for a, wb in ld))
        if not ld:
            continue
        first, sbs = ld[0][0], {wb for _, wb in ld}
        for a, s, _, wait in body:
            if a > first and sbs & set(wait):
                print(f"    {a:#x} waits on sb{sorted(sbs & set(wait))}: {s[:70]}")


def main(argv) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    text = open(argv[0]).read()
    for func in re.split(r"\n\s*Function : ", text)[1:]:
        head = func.split("\n", 1)[0]
        if any(frag in head for frag in argv[1:]):
            report(head.strip(), decode(func))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
