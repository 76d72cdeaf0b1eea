"""Every transform osprey supports, with the parameters it needs to construct in albumentations (defaults otherwise;
albumentations 1.4/2.0's names): test_albumentations_versions.py saves each with both versions, and
record_albumentationsx.py with AlbumentationsX (its names through albumentations_oracle.X_NAMES)."""

CORPUS = {
    "HorizontalFlip": {}, "VerticalFlip": {}, "Transpose": {}, "RandomRotate90": {}, "Rotate": {}, "Affine": {},
    "Perspective": {}, "RandomResizedCrop": {"size": [64, 64]}, "RandomCrop": {"height": 32, "width": 32},
    "CenterCrop": {"height": 32, "width": 32}, "BBoxSafeRandomCrop": {},
    "RandomSizedBBoxSafeCrop": {"height": 64, "width": 64}, "Resize": {"height": 64, "width": 80},
    "LongestMaxSize": {"max_size": 96}, "SmallestMaxSize": {"max_size": 72},
    "PadIfNeeded": {"min_height": 160, "min_width": 160}, "ColorJitter": {}, "RandomBrightnessContrast": {},
    "HueSaturationValue": {}, "RandomGamma": {}, "GaussianBlur": {}, "GaussNoise": {}, "ToGray": {},
    "ImageCompression": {}, "CoarseDropout": {}, "RandomScale": {}, "ShiftScaleRotate": {}, "Blur": {},
    "MedianBlur": {}, "SafeRotate": {},
    "RandomSizedCrop": {"min_max_height": [50, 100], "size": [64, 64]},
}
