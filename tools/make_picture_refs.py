#!/usr/bin/env python3
"""Writes the references of the Qwen-VL image processor (the torchvision "fast" one that
Qwen3-VL uses) for tests/unit/vision/processor_golden_test.cc.

Run where transformers, torch, torchvision and Pillow are (the GPU machine); everything runs on
the CPU. Small deterministic pictures are made here and saved as files; each file is opened
with PIL (Image.open, as a user would) and given alone to the processor constructed with
Qwen3-VL's parameters (patch_size 16, merge_size 2, temporal_patch_size 2, mean and std 0.5)
and small pixel bounds (min_pixels 4096, max_pixels 8192, so the references stay small):

  rgb_67x45.png          PNG RGB, grown to 64x96
  rgba_120x80.png        PNG RGBA (alpha varies), shrunk
  gray_33x517.png        PNG L, tall: a side floored to 0 patches becomes one factor
  gray16_50x40.png       PNG 16-bit grayscale, values up to 600 (Pillow clips to 255)
  palette_90x64.png      PNG P with a transparent entry
  jpeg_q90_150x100.jpg   JPEG RGB, quality 90
  cmyk_64x48.jpg         JPEG CMYK (Pillow writes Adobe's inverted samples)
  lossless_100x70.webp   WebP lossless
  lossy_67x45.webp       WebP lossy, quality 80

For each picture OUT holds the file, NAME.rgb.zlib where a decoder could differ from Pillow
(lossy formats, and the modes Pillow converts its own way: I;16, P, CMYK; zlib of Pillow's
convert("RGB") as uint8 [height, width, 3]) and NAME.codes.zlib (zlib of uint8 codes [patches, patch_dim]: with mean
and std 0.5 the processor's float32 pixel_values are exactly (code - 127.5) / 127.5, which this
script checks before writing, so the codes are lossless); cases.json lists them with the
config, grid_thw, the resized size and how the C++ side compares: "exact" (PNG, lossless WebP:
every float equal) or "within_one" (JPEG, lossy WebP: decoders of other versions may differ,
so each code within 1, i.e. 1/255 of the [0, 1] range before normalization).

Usage: python3 tools/make_picture_refs.py --out tests/golden/pictures
"""
import argparse
import json
import os
import zlib

import numpy as np
import PIL
import torch
import transformers
from PIL import Image

PATCH, MERGE, TEMPORAL = 16, 2, 2
MIN_PIXELS, MAX_PIXELS = 4096, 8192


def smooth(width, height, channels, seed):
    """Gradients and waves plus a little noise: resizing has edges to work on, and the files
    compress."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    planes = []
    for c in range(channels):
        v = (96 + 80 * np.sin(x / (3.0 + c) + seed) * np.cos(y / (5.0 + 2 * c)) + 60 * x / width
             + rng.randint(-3, 4, size=(height, width)))
        planes.append(v)
    return np.clip(np.stack(planes, axis=-1), 0, 255).astype(np.uint8)


def make_pictures(out):
    """Saves the pictures (modes from the arrays' shapes and dtypes: uint8 [h, w, 3] RGB,
    [h, w, 4] RGBA, [h, w] L, uint16 [h, w] I;16); returns [(name, file, compare)]."""
    cases = []

    def save(name, image, ext, compare, **kwargs):
        path = os.path.join(out, f"{name}.{ext}")
        image.save(path, **kwargs)
        cases.append((name, f"{name}.{ext}", compare))

    save("rgb_67x45", Image.fromarray(smooth(67, 45, 3, 1)), "png", "exact")
    rgba = smooth(120, 80, 4, 2)
    rgba[::7, ::5, 3] = 0  # fully transparent pixels keep their colors in the file
    save("rgba_120x80", Image.fromarray(rgba), "png", "exact")
    save("gray_33x517", Image.fromarray(smooth(33, 517, 1, 3)[:, :, 0]), "png", "exact")
    gray16 = (smooth(50, 40, 1, 4)[:, :, 0].astype(np.uint16) * 600 // 255).astype(np.uint16)
    save("gray16_50x40", Image.fromarray(gray16), "png", "exact")
    palette = Image.fromarray(smooth(90, 64, 3, 5)).convert("P", palette=Image.Palette.ADAPTIVE,
                                                           colors=32)
    save("palette_90x64", palette, "png", "exact", transparency=0)
    save("jpeg_q90_150x100", Image.fromarray(smooth(150, 100, 3, 6)), "jpg", "within_one",
         quality=90)
    save("cmyk_64x48", Image.fromarray(smooth(64, 48, 3, 7)).convert("CMYK"), "jpg",
         "within_one", quality=90)
    save("lossless_100x70", Image.fromarray(smooth(100, 70, 3, 8)), "webp", "exact",
         lossless=True)
    save("lossy_67x45", Image.fromarray(smooth(67, 45, 3, 9)), "webp", "within_one",
         quality=80)
    return cases


def make_processor():
    kwargs = dict(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL,
                  image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                  size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS})
    cls = getattr(transformers, "Qwen2VLImageProcessorFast", None)
    if cls is None:  # transformers 5 names the torchvision backend without "Fast"
        cls = transformers.Qwen2VLImageProcessor
    processor = cls(**kwargs)
    backend = getattr(processor, "backend", "torchvision" if "Fast" in type(processor).__name__ else "?")
    assert backend == "torchvision", f"{type(processor).__name__} runs on {backend}, not torchvision"
    return processor


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    processor = make_processor()
    entries = []
    for name, file, compare in make_pictures(args.out):
        image = Image.open(os.path.join(args.out, file))
        rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
        out = processor(images=[image], return_tensors="pt")
        pixel_values = out["pixel_values"]
        grid = [int(v) for v in out["image_grid_thw"][0]]
        assert pixel_values.dtype == torch.float32, pixel_values.dtype
        codes = torch.round(pixel_values * 127.5 + 127.5).clamp(0, 255).to(torch.uint8)
        assert torch.equal((codes.to(torch.float32) - 127.5) / 127.5, pixel_values), \
            f"{name}: pixel_values are not (code - 127.5) / 127.5"
        # Pillow's RGB where a decoder could differ from it (lossy formats, Pillow's own
        # conversions); PNG RGB and lossless WebP are the file's samples.
        rgb_file = None
        if compare == "within_one" or image.mode not in ("RGB", "RGBA", "L"):
            rgb_file = f"{name}.rgb.zlib"
            with open(os.path.join(args.out, rgb_file), "wb") as f:
                f.write(zlib.compress(np.ascontiguousarray(rgb).tobytes(), 9))
        with open(os.path.join(args.out, f"{name}.codes.zlib"), "wb") as f:
            f.write(zlib.compress(codes.numpy().tobytes(), 9))
        entries.append({
            "name": name, "file": file, "rgb": rgb_file, "mode": image.mode, "width": image.width,
            "height": image.height, "compare": compare, "grid_thw": grid,
            "resized": [grid[1] * PATCH, grid[2] * PATCH],
            "patches": int(pixel_values.shape[0]), "patch_dim": int(pixel_values.shape[1]),
        })
        print(f"{name}: {image.mode} {image.width}x{image.height} -> grid {grid}")
    meta = {
        "transformers": transformers.__version__, "torch": torch.__version__,
        "pillow": PIL.__version__, "processor": type(processor).__name__,
        "config": {"patch_size": PATCH, "merge_size": MERGE, "temporal_patch_size": TEMPORAL,
                   "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                   "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}},
    }
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump({"meta": meta, "cases": entries}, f, indent=1)
    total = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out))
    print(f"{args.out}: {len(entries)} pictures, {total} bytes")


if __name__ == "__main__":
    main()
