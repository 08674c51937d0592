// Text from outside made safe to echo, and the names fusor accepts.
#include "common/util/text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fusor {
namespace {

using ::testing::HasSubstr;

TEST(EchoTest, ControlsBidiAndBadUtf8AreEscapedAndLongInputsCut) {
  EXPECT_EQ(Echo("plain name"), "plain name");
  EXPECT_EQ(Echo("caf\xc3\xa9"), "caf\xc3\xa9");  // valid UTF-8 stays
  EXPECT_EQ(Echo("a\nb\r\tc"), "a\\nb\\r\\tc");
  EXPECT_EQ(Echo("\x1b[31mred"), "\\x1b[31mred");
  EXPECT_EQ(Echo("evil\xe2\x80\xaetxt.exe"), "evil\\u202etxt.exe");
  EXPECT_EQ(Echo("x\xe2\x81\xa6y"), "x\\u2066y");
  EXPECT_EQ(Echo("bad\xff\xc3"), "bad\\xff\\xc3");
  EXPECT_EQ(Echo("csi\xc2\x9b" "2J"), "csi\\u009b2J");  // a C1 control
  EXPECT_EQ(Echo("\xc0\xaf"), "\\xc0\\xaf");                   // an overlong '/'
  EXPECT_EQ(Echo("\xed\xa0\x80"), "\\xed\\xa0\\x80");          // a surrogate
  EXPECT_EQ(Echo("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // past U+10FFFF
  EXPECT_EQ(Echo("\xf0\x9f\x98\x80 \xc2\xa0"), "\xf0\x9f\x98\x80 \xc2\xa0");  // an emoji, a no-break space
  std::string newlines;
  for (int k = 0; k < 300; ++k) newlines += "\\n";
  EXPECT_EQ(Echo(std::string(300, '\n'), std::string::npos), newlines);  // escapes lengthen; npos never cuts
  const std::string echoed = Echo(std::string(18000, 'n'));
  EXPECT_LT(echoed.size(), 230u);
  EXPECT_THAT(echoed, HasSubstr("... (18000 bytes)"));
}

TEST(NameTest, NamesHaveALengthLimitAndACharacterSet) {
  EXPECT_TRUE(CheckName("worker-1.lab_a+b", "worker").ok());
  EXPECT_TRUE(CheckName("host:1234", "worker").ok());  // a worker's default name
  for (const std::string bad : {std::string(), std::string("a b"), std::string("x/../../tmp"), std::string(".."),
                                std::string("w\nfake log line"), std::string(129, 'a'), std::string("\xe2\x80\xae")}) {
    const absl::Status st = CheckName(bad, "worker");
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << bad;
    EXPECT_LT(st.message().size(), 300u);
    EXPECT_EQ(st.message().find('\n'), absl::string_view::npos);
  }
  EXPECT_TRUE(CheckLabel("bert-base (batch=8, seq=128)", "model").ok());
  EXPECT_FALSE(CheckLabel("a\x1b[2Jb", "model").ok());
  EXPECT_FALSE(CheckLabel(std::string(300, 'a'), "model").ok());
  EXPECT_EQ(SafeName("x/../../../../tmp/elsewhere"), "x_.._.._.._.._tmp_elsewhere");
  EXPECT_EQ(SafeName(".."), "_");
  EXPECT_TRUE(CheckName(SafeName("any \xe2\x80\xae thing/.."), "sweep").ok());
}

}  // namespace
}  // namespace fusor
