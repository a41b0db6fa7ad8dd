//go:build amd64 && !noasm

#include "textflag.h"

#define BCAST(bits, reg, xreg) MOVL $bits, AX; VMOVD AX, xreg; VBROADCASTSS xreg, reg

// func expAVX2(dst, src *float32, n int)
// dst[i] = e**src[i] for n floats, n a multiple of 8. Same algorithm as
// exp32: clamp to [-104, 89], x = k*ln2 + r, degree-7 polynomial for e**r,
// then scale by 2**(k/2) and 2**(k-k/2) so that overflow gives +Inf and
// underflow is gradual; NaN inputs are passed through.
TEXT ·expAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   done
	BCAST(0x3fb8aa3b, Y15, X15) // log2(e)
	BCAST(0x3f318000, Y14, X14) // ln2 high part
	BCAST(0xb95e8083, Y13, X13) // ln2 low part
	BCAST(0x42b20000, Y12, X12) // 89
	BCAST(0xc2d00000, Y11, X11) // -104
	BCAST(0x39500d01, Y10, X10) // 1/5040
	BCAST(0x3ab60b61, Y9, X9)   // 1/720
	BCAST(0x3c088889, Y8, X8)   // 1/120
	BCAST(0x3d2aaaab, Y7, X7)   // 1/24
	BCAST(0x3e2aaaab, Y6, X6)   // 1/6
	BCAST(0x3f000000, Y5, X5)   // 0.5
	BCAST(0x3f800000, Y4, X4)   // 1.0, also 127<<23

loop:
	VMOVUPS (SI), Y0
	VMINPS  Y12, Y0, Y1          // clamp
	VMAXPS  Y11, Y1, Y1
	VMULPS  Y15, Y1, Y2
	VROUNDPS $0, Y2, Y2          // k = round(x*log2e)
	VFNMADD231PS Y14, Y2, Y1     // r = x - k*ln2hi
	VFNMADD231PS Y13, Y2, Y1     //     - k*ln2lo
	VMOVAPS Y10, Y3              // Horner
	VFMADD213PS Y9, Y1, Y3
	VFMADD213PS Y8, Y1, Y3
	VFMADD213PS Y7, Y1, Y3
	VFMADD213PS Y6, Y1, Y3
	VFMADD213PS Y5, Y1, Y3
	VFMADD213PS Y4, Y1, Y3
	VFMADD213PS Y4, Y1, Y3       // p = e**r
	VCVTPS2DQ Y2, Y2             // k as int32
	VPSRAD  $1, Y2, Y1           // k1 = k>>1
	VPSUBD  Y1, Y2, Y2           // k2 = k-k1
	VPSLLD  $23, Y1, Y1
	VPADDD  Y4, Y1, Y1           // 2**k1
	VPSLLD  $23, Y2, Y2
	VPADDD  Y4, Y2, Y2           // 2**k2
	VMULPS  Y1, Y3, Y3
	VMULPS  Y2, Y3, Y3
	VCMPPS  $3, Y0, Y0, Y1       // NaN lanes
	VBLENDVPS Y1, Y0, Y3, Y3
	VMOVUPS Y3, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNZ  loop

done:
	VZEROUPPER
	RET
