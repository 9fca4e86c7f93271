// The HTML page of a map too dense for a shape per run of equal cells: an
// image with shapes over it, still naming every refused and constrained
// module, light and script-free; a small map keeps a shape per run.
#include "e2e_support.hpp"

namespace mx2nv::e2e {
namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(HtmlPage, ADenseMapIsAnImageThatStillNamesEveryFlaggedModule) {
  ScratchDir d;
  // 3 layers x 4,000 experts: 12,000 modules per projection with random
  // spans, more runs of equal cells than a map draws as shapes.
  const std::string refused = "language_model.model.layers.2.block_sparse_moe.experts.3777.w2";
  const std::string constrained = "language_model.model.layers.0.block_sparse_moe.experts.3999.w1";
  const CliResult g = run_cli("generate " + (d / "src").string() + " --layers 3 --experts 4000 --hidden 64 "
                              "--intermediate 32 --shards 2 --seed 11 --set-span " + refused + "=20 --set-span " +
                              constrained + "=16");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  // Under e4m3 (limit 17) span 16 is constrained and span 20 refused.
  const CliResult r = run_cli("inspect " + (d / "src").string() + " --window e4m3 --html " + (d / "page.html").string());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const std::string page = read_file(d / "page.html");
  EXPECT_LT(page.size(), 1'000'000u);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  // w1 and w3 have random spans: drawn as images; each image is one PNG.
  EXPECT_GE(count(page, "data-drawn=\"image\""), 2u);
  EXPECT_EQ(count(page, "data-drawn=\"image\""), count(page, "href=\"data:image/png;base64,"));
  // Every layer of a dense map has shapes to hover, with the layer and experts in their titles.
  EXPECT_NE(page.find("<title>layer 2, experts 0-"), std::string::npos);
  // Under each dense map, every layer's counts as text: layer 2 of w2 holds the refused module.
  EXPECT_EQ(count(page, "Per layer: modules by class"), count(page, "data-drawn=\"image\""));
  EXPECT_NE(page.find("<tr><td>layer 2</td><td class=\"num\">4000</td>"), std::string::npos);
  // The flagged modules: a shape of their own, named, and listed.
  for (const auto& [name, cls] : {std::pair{refused, std::string("refused")}, std::pair{constrained, std::string("constrained")}}) {
    EXPECT_NE(page.find("class=\"cell " + cls + "\"><title>"), std::string::npos) << cls;
    EXPECT_GE(count(page, name), 2u) << name;
  }
}

TEST(HtmlPage, ASmallMapKeepsAShapePerRun) {
  ScratchDir d;
  const CliResult g = run_cli("generate " + (d / "src").string() + " --layers 2 --experts 8 --seed 11");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  const CliResult r = run_cli("inspect " + (d / "src").string() + " --html " + (d / "page.html").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string page = read_file(d / "page.html");
  EXPECT_EQ(page.find("data-drawn=\"image\""), std::string::npos);
  EXPECT_EQ(page.find("data:image/png"), std::string::npos);
  EXPECT_NE(page.find("<title>layer 0, expert"), std::string::npos);
}

}  // namespace
}  // namespace mx2nv::e2e
