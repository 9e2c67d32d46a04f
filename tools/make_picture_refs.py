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
  jpeg_q90_120x90.jpg    JPEG RGB, quality 90, shrunk
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

Video (Qwen3VLVideoProcessor and Qwen3VLProcessor), in cases.json's "video":
  sampling     sample_frames' indices for a few (total frames, fps) with the processor's
               defaults (2 frames a second, 4 to 768 frames)
  timestamps   Qwen3VLProcessor._calculate_timestamps of a few index lists and the text the
               processor writes for each ("<0.1 seconds>")
  frames       frame_0.png .. frame_4.png (33x50 RGB), given as one video of 5 frames (not
               sampled) to the video processor with size {4096, 16384}: video.codes.zlib as for
               pictures, compared exactly
A part that transformers could not make holds "error" instead.

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
             + rng.randint(-2, 3, size=(height, width)))
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
    save("jpeg_q90_120x90", Image.fromarray(smooth(120, 90, 3, 6)), "jpg", "within_one",
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


VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS = 4096, 16384


def video_refs(out):
    result = {}
    try:
        from transformers.video_utils import VideoMetadata
        vp = transformers.Qwen3VLVideoProcessor()
        samples = []
        for total, fps in [(100, 25.0), (10, 30.0), (3, 24.0), (48, None), (1000, 30.0),
                           (100000, 1.0), (7, 2.0)]:
            indices = vp.sample_frames(VideoMetadata(total_num_frames=total, fps=fps))
            samples.append({"total": total, "fps": fps, "indices": [int(i) for i in indices]})
        result["sampling"] = {"config": {"fps": vp.fps, "min_frames": vp.min_frames,
                                         "max_frames": vp.max_frames}, "cases": samples}
    except Exception as e:  # recorded for the C++ test to report
        result["sampling"] = {"error": repr(e)}
    try:
        from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
        cases = []
        for indices, fps in [([0, 3, 6, 9], 30.0), ([0, 1, 2], 24.0),
                             ([0, 14, 28, 42, 57, 71, 85, 99], 25.0), ([5, 17, 29], 2.0)]:
            times = Qwen3VLProcessor._calculate_timestamps(None, list(indices), fps, TEMPORAL)
            cases.append({"indices": indices, "fps": fps, "times": [float(t) for t in times],
                          "texts": [f"<{t:.1f} seconds>" for t in times]})
        result["timestamps"] = {"cases": cases}
    except Exception as e:
        result["timestamps"] = {"error": repr(e)}
    try:
        files = []
        for i in range(5):
            files.append(f"frame_{i}.png")
            Image.fromarray(smooth(50, 33, 3, 20 + i)).save(os.path.join(out, files[-1]))
        frames = np.stack([np.asarray(Image.open(os.path.join(out, f)).convert("RGB")) for f in files])
        kwargs = dict(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL,
                      image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                      size={"shortest_edge": VIDEO_MIN_PIXELS, "longest_edge": VIDEO_MAX_PIXELS})
        vp = transformers.Qwen3VLVideoProcessor(**kwargs)
        try:
            out_v = vp([frames], do_sample_frames=False, cap_pixels_per_frame=False,
                       return_tensors="pt")
        except (TypeError, ValueError):  # a transformers without cap_pixels_per_frame
            out_v = vp([frames], do_sample_frames=False, return_tensors="pt")
        pixel_values = out_v["pixel_values_videos"]
        if pixel_values.ndim == 3:  # [videos, patches, dim]
            pixel_values = pixel_values[0]
        grid = [int(v) for v in out_v["video_grid_thw"][0]]
        codes = torch.round(pixel_values * 127.5 + 127.5).clamp(0, 255).to(torch.uint8)
        assert torch.equal((codes.to(torch.float32) - 127.5) / 127.5, pixel_values)
        with open(os.path.join(out, "video.codes.zlib"), "wb") as f:
            f.write(zlib.compress(codes.numpy().tobytes(), 9))
        result["frames"] = {"files": files, "grid_thw": grid, "patches": int(pixel_values.shape[0]),
                            "patch_dim": int(pixel_values.shape[1]),
                            "config": {**kwargs, "do_sample_frames": False}}
        print(f"video: {len(files)} frames 33x50 -> grid {grid}")
    except Exception as e:
        result["frames"] = {"error": repr(e)}
    return result


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
    video = video_refs(args.out)
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump({"meta": meta, "cases": entries, "video": video}, f, indent=1)
    total = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out))
    print(f"{args.out}: {len(entries)} pictures, {total} bytes")


if __name__ == "__main__":
    main()
