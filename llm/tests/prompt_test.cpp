// Prompt templates: the shipped prompts/ files load and render; rendering and loading errors name
// what is wrong (placeholder, key, TOML position); values are never expanded twice.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "kz/core/files.h"
#include "kz/llm/extract.h"
#include "kz/llm/prompt.h"

namespace kz {
namespace {

// CTest sets KZ_SOURCE_DIR; run by hand from the repository root, "." works too.
std::filesystem::path source_dir() {
  const char* dir = std::getenv("KZ_SOURCE_DIR");
  return dir ? std::filesystem::path(dir) : std::filesystem::path(".");
}

std::filesystem::path prompts_dir() { return source_dir() / "prompts"; }

// Writes `text` to a fresh file and loads it as a template.
Result<PromptTemplate> load_text(const std::string& text) {
  auto dir = make_unique_dir(std::filesystem::temp_directory_path(), "kz_prompt_test");
  if (!dir.ok()) return dir.status();
  auto path = *dir / "t.toml";
  KZ_RETURN_IF_ERROR(write_file_atomic(path, text));
  return load_prompt_template(path);
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(Render, ReplacesPlaceholders) {
  auto out = render("a {{x}} b {{ y }} c {{x}}", {{"x", "1"}, {"y", "2"}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out, "a 1 b 2 c 1");
}

TEST(Render, UnknownPlaceholderIsNamed) {
  auto out = render("hello {{who}}", {{"name", "x"}});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::invalid_argument);
  EXPECT_TRUE(contains(out.status().message(), "who")) << out.status().message();
}

TEST(Render, MalformedAndUnterminatedPlaceholders) {
  EXPECT_FALSE(render("x {{not a name}} y", {}).ok());
  auto open = render("x {{name", {{"name", "v"}});
  ASSERT_FALSE(open.ok());
  EXPECT_TRUE(contains(open.status().message(), "unterminated")) << open.status().message();
}

TEST(Render, ValuesAreNotExpandedAgain) {
  // A reference module or CUDA source may contain "{{" (or even a placeholder-looking string).
  auto out = render("<{{code}}>", {{"code", "d = {{'a': 1}}; {{other}}"}, {"other", "BAD"}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out, "<d = {{'a': 1}}; {{other}}>");
}

TEST(Render, TextWithoutPlaceholdersIsUnchanged) { EXPECT_EQ(*render("plain } { text", {}), "plain } { text"); }

TEST(LoadTemplate, ReadsKeysAndExtras) {
  auto t = load_text("name = \"t1\"\ndescription = \"d\"\nsystem = \"S {{a}}\"\nuser = '''\nU {{b}}'''\nextra = \"E\"\n");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->name, "t1");
  EXPECT_EQ(t->description, "d");
  EXPECT_EQ(t->system, "S {{a}}");
  EXPECT_EQ(t->user, "U {{b}}");  // TOML trims the newline right after '''
  EXPECT_EQ(t->extras.at("extra"), "E");
}

TEST(LoadTemplate, NameDefaultsToStem) {
  auto t = load_text("system = \"s\"\nuser = \"u\"\n");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->name, "t");
}

TEST(LoadTemplate, MissingSystemOrUserIsNamed) {
  auto no_user = load_text("system = \"s\"\n");
  ASSERT_FALSE(no_user.ok());
  EXPECT_TRUE(contains(no_user.status().message(), "'user'")) << no_user.status().message();
  auto no_system = load_text("user = \"u\"\n");
  ASSERT_FALSE(no_system.ok());
  EXPECT_TRUE(contains(no_system.status().message(), "'system'")) << no_system.status().message();
}

TEST(LoadTemplate, NonStringValueIsRefused) {
  auto t = load_text("system = \"s\"\nuser = \"u\"\ntemperature = 0.7\n");
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(contains(t.status().message(), "temperature")) << t.status().message();
}

TEST(LoadTemplate, BadTomlGivesFileLineColumn) {
  auto t = load_text("system = \"s\"\nuser = \"u\"\n\nbroken = = 3\n");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::parse_error);
  EXPECT_TRUE(contains(t.status().message(), "t.toml:4:")) << t.status().message();
}

TEST(LoadTemplate, MissingFileIsNotFound) {
  auto t = load_prompt_template("/nonexistent/kz/prompt.toml");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::not_found);
}

TEST(BuildMessages, ExtrasAreValuesAndCallerWins) {
  PromptTemplate t{"t", "", "sys {{example}}", "user {{reference_source}} {{example}}", {{"example", "E"}}};
  auto messages = build_messages(t, {{"reference_source", "R {{example}}"}});
  ASSERT_TRUE(messages.ok()) << messages.status().to_string();
  ASSERT_EQ(messages->size(), 2u);
  EXPECT_EQ((*messages)[0].role, "system");
  EXPECT_EQ((*messages)[0].content, "sys E");
  EXPECT_EQ((*messages)[1].role, "user");
  EXPECT_EQ((*messages)[1].content, "user R {{example}} E");
  auto overridden = build_messages(t, {{"reference_source", "R"}, {"example", "mine"}});
  ASSERT_TRUE(overridden.ok());
  EXPECT_EQ((*overridden)[0].content, "sys mine");
}

TEST(BuildMessages, MissingValueNamesTemplateAndPlaceholder) {
  PromptTemplate t{"coder", "", "sys", "user {{reference_source}}", {}};
  auto messages = build_messages(t, {});
  ASSERT_FALSE(messages.ok());
  EXPECT_TRUE(contains(messages.status().message(), "coder")) << messages.status().message();
  EXPECT_TRUE(contains(messages.status().message(), "reference_source")) << messages.status().message();
}

TEST(CoderPromptPath, MapsFormatsToShippedFiles) {
  for (auto [format, file] : {std::pair{"cuda-rtc", "coder_cuda_rtc.toml"}, std::pair{"triton", "coder_triton.toml"},
                              std::pair{"cuda", "coder_cuda.toml"}}) {
    auto path = coder_prompt_path(prompts_dir(), format);
    ASSERT_TRUE(path.ok()) << path.status().to_string();
    EXPECT_EQ(path->filename(), file);
  }
  EXPECT_EQ(coder_prompt_path(prompts_dir(), "torch").status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(coder_prompt_path("/nonexistent", "triton").status().code(), StatusCode::not_found);
}

// Every coder template renders with a real reference, and its one-shot example is well formed.
TEST(ShippedTemplates, CodersRenderWithAReference) {
  auto reference = read_file(source_dir() / "suite/kzbench/level1/02_relu.py");
  ASSERT_TRUE(reference.ok()) << reference.status().to_string();
  for (const char* format : {"cuda-rtc", "triton", "cuda"}) {
    SCOPED_TRACE(format);
    auto path = coder_prompt_path(prompts_dir(), format);
    ASSERT_TRUE(path.ok()) << path.status().to_string();
    auto t = load_prompt_template(*path);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_FALSE(t->description.empty());
    ASSERT_TRUE(t->extras.count("example_reference") && t->extras.count("example_candidate"));
    EXPECT_TRUE(contains(t->extras.at("example_reference"), "class Model("));
    EXPECT_TRUE(contains(t->extras.at("example_candidate"), "class ModelNew("));
    auto messages = build_messages(*t, {{"reference_source", *reference}});
    ASSERT_TRUE(messages.ok()) << messages.status().to_string();
    const std::string& user = (*messages)[1].content;
    EXPECT_TRUE(contains(user, "return torch.relu(x)"));
    EXPECT_TRUE(contains(user, t->extras.at("example_candidate")));
    EXPECT_FALSE(contains((*messages)[0].content + user, "{{"));
    // A reply that echoes the prompt's own code blocks would be read as the last one: the task.
    EXPECT_TRUE(contains(*extract_code(user), "return torch.relu(x)"));
  }
}

TEST(ShippedTemplates, CudaRtcExampleUsesKzRtc) {
  auto t = load_prompt_template(prompts_dir() / "coder_cuda_rtc.toml");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::string& candidate = t->extras.at("example_candidate");
  EXPECT_TRUE(contains(candidate, "import kz_rtc"));
  EXPECT_TRUE(contains(candidate, "kz_rtc.compile("));
  EXPECT_TRUE(contains(candidate, "extern \"C\" __global__"));
}

TEST(ShippedTemplates, ProposerRenders) {
  auto t = load_prompt_template(prompts_dir() / "proposer.toml");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  auto messages = build_messages(*t, {{"apis", "- torch.nn.Conv2d\n- torch.tanh"}, {"level", "2"}});
  ASSERT_TRUE(messages.ok()) << messages.status().to_string();
  const std::string& user = (*messages)[1].content;
  EXPECT_TRUE(contains(user, "- torch.nn.Conv2d\n- torch.tanh"));
  EXPECT_TRUE(contains(user, "level 2"));
  EXPECT_TRUE(contains(user, "def get_init_inputs()"));
  EXPECT_FALSE(contains((*messages)[0].content + user, "{{"));
}

TEST(ShippedTemplates, EveryFileInPromptsLoads) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(prompts_dir())) {
    if (entry.path().extension() != ".toml") continue;
    auto t = load_prompt_template(entry.path());
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    ++count;
  }
  EXPECT_GE(count, 4);
}

}  // namespace
}  // namespace kz
