// Hand-written parameter lists for the optimizer tests and benches: tensors laid out back to back
// from offset 0 (no padding, unlike the model's arena), so a test states its layout as a list of
// Add calls.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/model/model.h"

namespace moelab::test {

class ParamList {
 public:
  // Appends a [rows, cols] tensor after the last one.
  void Add(std::string name, ParamKind kind, int layer, int rows, int cols) {
    AddStacked(std::move(name), kind, layer, /*batch=*/1, rows, cols);
  }
  // Appends `batch` stacked [rows, cols] matrices (experts) after the last tensor.
  void AddStacked(std::string name, ParamKind kind, int layer, int batch, int rows, int cols) {
    infos_.push_back({.name = std::move(name),
                      .kind = kind,
                      .layer = layer,
                      .offset = size_,
                      .batch = batch,
                      .rows = rows,
                      .cols = cols});
    size_ += infos_.back().size();
  }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  // The arena length: every tensor's elements.
  size_t size() const { return size_; }

 private:
  std::vector<ParamInfo> infos_;
  size_t size_ = 0;
};

}  // namespace moelab::test
