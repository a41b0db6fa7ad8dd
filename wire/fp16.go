package wire

import "math"

// Float32ToHalf converts f to IEEE 754 binary16 bits, rounding to nearest
// with ties to even. Values beyond the half range become ±Inf, values below
// the smallest subnormal become ±0, NaN stays NaN (quiet, payload truncated).
func Float32ToHalf(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff

	if exp == 0xff { // Inf or NaN
		if mant == 0 {
			return sign | 0x7c00
		}
		m := uint16(mant >> 13)
		return sign | 0x7c00 | 0x0200 | m // keep it a quiet NaN
	}
	// Unbiased exponent, re-biased for half (bias 15).
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00 // overflow
	}
	if e <= 0 {
		// Subnormal half or zero. The value is mant24 * 2^(exp-150) and a
		// half subnormal unit is 2^-24, so shift right by 126-exp.
		if e < -10 {
			return sign // too small even for rounding up to the smallest subnormal
		}
		m := mant | 0x800000 // implicit leading one
		shift := uint32(14 - e)
		half := m >> shift
		rem := m & (1<<shift - 1)
		mid := uint32(1) << (shift - 1)
		if rem > mid || (rem == mid && half&1 == 1) {
			half++ // may carry into the smallest normal, which is correct
		}
		return sign | uint16(half)
	}
	half := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && half&1 == 1) {
		half++ // may carry into the exponent, up to Inf, which is correct
	}
	return sign | uint16(half)
}

// HalfToFloat32 converts IEEE 754 binary16 bits to float32 exactly.
func HalfToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	default:
		// Subnormal: mant * 2^-24, exactly representable as a float32 normal.
		v := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			return -v
		}
		return v
	}
}
