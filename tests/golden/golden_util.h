// Helpers the golden tests share across backends: reading reference tensors, comparing logits
// against a tolerance relative to the largest reference value, and greedy decoding one row at a
// time as an engine would.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "jobs/convert.h"
#include "model/model.h"

namespace gizllm::golden {

// int64 ids of a reference tensor as int32.
inline std::vector<int32_t> ReadIds(const TensorInfo& t) {
  std::vector<int32_t> ids(t.Elements());
  for (size_t i = 0; i < ids.size(); ++i) {
    int64_t v;
    std::memcpy(&v, t.data + 8 * i, 8);
    ids[i] = static_cast<int32_t>(v);
  }
  return ids;
}

inline std::vector<float> ReadFloats(const TensorInfo& t) {
  std::vector<float> v(t.Elements());
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

// max |ours - ref| <= tolerance * max |ref|; a NaN in ours fails.
inline void ExpectClose(const std::vector<float>& ours, const std::vector<float>& ref,
                        float tolerance, const std::string& what) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  float max_ref = 0, max_diff = 0;
  double diff2 = 0, ref2 = 0;  // for the message: ||ours - ref|| / ||ref||
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref[i]));
    float d = std::fabs(ours[i] - ref[i]);
    if (!(d <= max_diff)) max_diff = std::isnan(d) ? INFINITY : d;
    diff2 += static_cast<double>(d) * d;
    ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  EXPECT_GT(max_ref, 0.0f) << what;
  EXPECT_LE(max_diff, tolerance * max_ref)
      << what << ": max diff " << max_diff << ", max |ref| " << max_ref << " ("
      << max_diff / max_ref << " of it; norm of the difference over norm of the reference "
      << std::sqrt(diff2 / ref2) << ")";
}

// Logits capped as c * tanh(x / c) back to x (clamped short of +-c), so that a model with final
// soft-capping is compared where its error arises: a cap much below the largest logit squeezes
// the reference's range to c while a fast mode's rounding error scales with the uncapped logits.
inline std::vector<float> Uncapped(const std::vector<float>& capped, float cap) {
  std::vector<float> x(capped.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double u = std::clamp(static_cast<double>(capped[i]) / cap, -1 + 1e-7, 1 - 1e-7);
    x[i] = static_cast<float>(cap * std::atanh(u));
  }
  return x;
}

// ||ours - ref|| / ||ref|| <= tolerance (relative error in norm); a NaN in ours fails.
inline void ExpectCloseInNorm(const std::vector<float>& ours, const std::vector<float>& ref,
                              double tolerance, const std::string& what) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double d = static_cast<double>(ours[i]) - ref[i];
    diff2 += d * d;
    ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  EXPECT_GT(ref2, 0.0) << what;
  const double relative = std::sqrt(diff2 / ref2);
  EXPECT_LE(relative, tolerance) << what << ": norm of the difference over norm of the reference "
                                 << relative;  // NaN fails the comparison
}

// Greedy tokens after `prompt`, one decode row per step, until `count` tokens or a stop id.
inline Expected<std::vector<int32_t>> GreedyTokens(Model& model, const std::vector<int32_t>& prompt,
                                                   size_t count, const std::vector<int32_t>& stop) {
  const int32_t max_pages = static_cast<int32_t>((prompt.size() + count) / kPage + 1);
  std::vector<int32_t> pages(max_pages);
  std::iota(pages.begin(), pages.end(), 0);
  PageTables tables{pages.data(), 1, max_pages};
  GZ_RETURN_IF_ERROR(model.AllocatePages(max_pages));
  Rows rows;
  for (size_t p = 0; p < prompt.size(); ++p)
    rows.Push(prompt[p], 0, static_cast<int32_t>(p), p + 1 == prompt.size());
  std::vector<float> logits(model.arch().vocab);
  std::vector<int32_t> out;
  int32_t position = static_cast<int32_t>(prompt.size());
  while (out.size() < count) {
    GZ_RETURN_IF_ERROR(model.Step(rows, tables, logits.data()));
    int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    if (std::find(stop.begin(), stop.end(), next) != stop.end()) break;
    rows.Clear();
    rows.Push(next, 0, position++, true);
  }
  return out;
}

// `from` converted by quant::Convert into `to` with the bits `bits` ("4/8", "8"; as --bits).
inline void Convert(const std::string& from, const std::string& to, const std::string& bits) {
  quant::ConvertOptions o;
  o.from = from;
  o.to = to;
  auto parsed = quant::ParseBits(bits);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  o.bits = *parsed;
  auto converted = quant::Convert(o);
  ASSERT_TRUE(converted.ok()) << converted.status().message();
}

}  // namespace gizllm::golden
