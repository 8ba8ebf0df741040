"""bench/sass_loop.py's SASS reading (the loop the NOTES quote instruction counts and load positions from), on a
hand-written listing: the longest backward branch's span is the loop, predicates do not change an opcode."""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("sass_loop", Path(__file__).parent.parent / "bench" / "sass_loop.py")
sass_loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass_loop)

LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                /* 0x000 */
        /*0010*/                   S2R R0, SR_TID.X ;                    /* 0x000 */
        /*0020*/                   LOP3.LUT R2, R0, 0xf, RZ, 0xc0, !PT ; /* 0x000 */
        /*0030*/               @P0 LDG.E.128 R4, desc[UR4][R2.64] ;      /* 0x000 */
        /*0040*/                   HADD2 R8, R4, R5 ;                    /* 0x000 */
        /*0050*/              @!P1 BRA 0x30 ;                            /* 0x000 */
        /*0060*/                   IADD3 R9, R9, 0x1, RZ ;               /* 0x000 */
        /*0070*/               @P2 BRA 0x60 ;                            /* 0x000 */
        /*0080*/                   EXIT ;                                /* 0x000 */
        /*0090*/                   BRA 0x90;                             /* 0x000 */
"""


def test_longest_backward_branch_is_the_loop():
    ins = sass_loop.instructions(LISTING)
    assert len(ins) == 10 and ins[3] == (0x30, "@P0 LDG.E.128 R4, desc[UR4][R2.64]")
    body = sass_loop.longest_loop(ins)
    # 0x30..0x50 (three instructions) beats 0x60..0x70; the self-branch at 0x90 is not backward
    assert [sass_loop.opcode(t) for t in body] == ["LDG.E.128", "HADD2", "BRA"]


def test_no_backward_branch_is_no_loop():
    assert sass_loop.longest_loop(sass_loop.instructions(LISTING.split("/*0050*/")[0])) == []
