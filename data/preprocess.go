package data

// Preprocessing says how a data set's feature vectors were made from raw
// images, so that a model trained on them can be fed correctly by a reader
// that has neither this package nor the data set: checkpoints store it as
// JSON (docs/checkpoint.md).
type Preprocessing struct {
	// Image is the raw image's shape, [rows, cols] of grey pixels in
	// [0, 255]; the feature vector is the image flattened row-major.
	Image []int `json:"image"`
	// Each feature is (pixel·Scale − Mean) / Std.
	Scale float64 `json:"scale"`
	Mean  float64 `json:"mean"`
	Std   float64 `json:"std"`
	// Classes names the labels in order (the model's outputs).
	Classes []string `json:"classes"`
}

// FashionMNISTPreprocessing describes LoadFashionMNIST's features: pixels
// scaled to [0, 1], then standardized with PixelMean and PixelStd when
// standardize is set (LoadOptions.Standardize).
func FashionMNISTPreprocessing(standardize bool) Preprocessing {
	p := Preprocessing{Image: []int{ImageSide, ImageSide}, Scale: 1.0 / 255, Mean: 0, Std: 1, Classes: ClassNames()}
	if standardize {
		p.Mean, p.Std = PixelMean, PixelStd
	}
	return p
}
