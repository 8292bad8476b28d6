#include "store/s3/aws_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace wharf::s3 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Pair;

// Distinctive secrets: no message, source or debug string may contain them.
constexpr char kEnvSecret[] = "ENVSECRETwJalrXUtnFEMIK7MDENG";
constexpr char kFileSecret[] = "FILESECRETbPxRfiCYEXAMPLEKEY";
constexpr char kConfigSecret[] = "CONFIGSECRETzzzzzzzzzzzzzzzz";
constexpr char kOverrideSecret[] = "OVERRIDESECRETyyyyyyyyyyyyyy";
constexpr char kToken[] = "TOKENxxxxxxxxxxxxxxxxxxxxxxxx";

void ExpectNoSecrets(absl::string_view text) {
  for (absl::string_view secret :
       {kEnvSecret, kFileSecret, kConfigSecret, kOverrideSecret, kToken}) {
    EXPECT_THAT(text, Not(HasSubstr(secret)));
  }
}

// ---------------------------------------------------------------------------------------------
// ParseAwsIni

TEST(ParseAwsIniTest, SectionsPropertiesAndComments) {
  absl::StatusOr<IniFile> ini = ParseAwsIni(
      "# leading comment\n"
      "; another\n"
      "[default]\n"
      "aws_access_key_id=AKID\n"
      "  \n"
      "Region =   us-west-2   # inline comment\n"
      "output = json;not a comment\n"
      "\n"
      "[ profile  dev ]  # comment after a header\n"
      "region = eu-west-1 ; inline\n"
      "empty =\n"
      "  # indented comment\n");
  ASSERT_TRUE(ini.ok()) << ini.status();
  EXPECT_THAT(*ini, ElementsAre(Pair("default", testing::_), Pair("profile  dev", testing::_)));
  EXPECT_THAT(ini->at("default").values,
              ElementsAre(Pair("aws_access_key_id", "AKID"), Pair("output", "json;not a comment"),
                          Pair("region", "us-west-2")));
  EXPECT_THAT(ini->at("profile  dev").values,
              ElementsAre(Pair("empty", ""), Pair("region", "eu-west-1")));
  EXPECT_THAT(ini->at("profile  dev").subsections, IsEmpty());
}

TEST(ParseAwsIniTest, NestedSubsectionAndContinuation) {
  absl::StatusOr<IniFile> ini = ParseAwsIni(
      "[profile minio]\n"
      "s3 =\n"
      "    addressing_style = path\n"
      "\tendpoint_url = http://localhost:9000   # local\n"
      "\n"
      "    max_concurrent_requests=20\n"
      "region = us-east-1\n"
      "note = first\n"
      "  second\n");
  ASSERT_TRUE(ini.ok()) << ini.status();
  const IniSection& s = ini->at("profile minio");
  EXPECT_THAT(s.subsections.at("s3"), ElementsAre(Pair("addressing_style", "path"),
                                                  Pair("endpoint_url", "http://localhost:9000"),
                                                  Pair("max_concurrent_requests", "20")));
  EXPECT_THAT(s.values, ElementsAre(Pair("note", "first\nsecond"), Pair("region", "us-east-1")));
}

TEST(ParseAwsIniTest, CrlfBomRepeatedSectionsAndLastDefinitionWins) {
  absl::StatusOr<IniFile> ini =
      ParseAwsIni("\xEF\xBB\xBF[a]\r\nx = 1\r\ny = 2\r\n[b]\r\nz = 3\r\n[a]\r\nx = 4\r\n");
  ASSERT_TRUE(ini.ok()) << ini.status();
  EXPECT_THAT(ini->at("a").values, ElementsAre(Pair("x", "4"), Pair("y", "2")));
  EXPECT_THAT(ini->at("b").values, ElementsAre(Pair("z", "3")));
}

TEST(ParseAwsIniTest, ValuesKeepHashWithoutWhitespaceAndEquals) {
  absl::StatusOr<IniFile> ini =
      ParseAwsIni("[default]\nsecret = ab#cd/ef+gh==\nurl = http://h/#x\n");
  ASSERT_TRUE(ini.ok()) << ini.status();
  EXPECT_THAT(ini->at("default").values,
              ElementsAre(Pair("secret", "ab#cd/ef+gh=="), Pair("url", "http://h/#x")));
}

TEST(ParseAwsIniTest, ErrorsNameTheLineButNeverQuoteIt) {
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {absl::StrCat("aws_secret_access_key = ", kFileSecret, "\n"),
       "line 1: property before the first [section]"},
      {absl::StrCat("[default]\n\naws_secret_access_key ", kFileSecret, "\n"),
       "line 3: expected 'name = value'"},
      {absl::StrCat("[default]\n = ", kFileSecret, "\n"), "line 2: property with an empty name"},
      {"[default\n", "line 1: section header without a closing ']'"},
      {"[ ]\n", "line 1: section with an empty name"},
      {absl::StrCat("[default]\ns3 =\n  ", kFileSecret, "\n"), "line 3: expected 'name = value'"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<IniFile> ini = ParseAwsIni(c.text);
    EXPECT_EQ(ini.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_EQ(ini.status().message(), c.message) << c.text;
  }
}

// ---------------------------------------------------------------------------------------------
// ResolveS3ClientConfig

class AwsConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    home_ = absl::StrCat(::testing::TempDir(), "/aws_config_test_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name(), "_",
                         getpid());
    ASSERT_EQ(mkdir(home_.c_str(), 0700), 0) << home_;
    ASSERT_EQ(mkdir((home_ + "/.aws").c_str(), 0700), 0);
    env_["HOME"] = home_;
  }
  void TearDown() override {
    unlink(credentials_path().c_str());
    unlink(config_path().c_str());
    rmdir((home_ + "/.aws").c_str());
    rmdir(home_.c_str());
  }

  std::string credentials_path() const { return home_ + "/.aws/credentials"; }
  std::string config_path() const { return home_ + "/.aws/config"; }

  static void WriteFile(const std::string& path, absl::string_view content) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << content;
    ASSERT_TRUE(out.good()) << path;
  }
  void WriteCredentials(absl::string_view content) { WriteFile(credentials_path(), content); }
  void WriteConfig(absl::string_view content) { WriteFile(config_path(), content); }

  EnvLookup Env() const {
    return [env = env_](absl::string_view name) -> std::optional<std::string> {
      auto it = env.find(std::string(name));
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
  }

  absl::StatusOr<S3ClientConfig> Resolve(const S3ClientOverrides& overrides = {}) {
    absl::StatusOr<S3ClientConfig> config = ResolveS3ClientConfig(overrides, Env());
    if (config.ok()) {
      ExpectNoSecrets(config->credentials_source);
      ExpectNoSecrets(config->DebugString());
    } else {
      ExpectNoSecrets(config.status().ToString());
    }
    return config;
  }

  void SetEnvCredentials() {
    env_["AWS_ACCESS_KEY_ID"] = "AKIAENV";
    env_["AWS_SECRET_ACCESS_KEY"] = kEnvSecret;
  }

  std::string home_;
  std::map<std::string, std::string> env_;
};

TEST_F(AwsConfigTest, DefaultsWithEnvironmentCredentials) {
  SetEnvCredentials();
  absl::StatusOr<S3ClientConfig> config = Resolve();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->credentials.access_key_id, "AKIAENV");
  EXPECT_EQ(config->credentials.secret_access_key, kEnvSecret);
  EXPECT_EQ(config->credentials.session_token, "");
  EXPECT_EQ(config->credentials_source, "environment (AWS_ACCESS_KEY_ID)");
  EXPECT_EQ(config->profile, "default");
  EXPECT_EQ(config->region, "us-east-1");
  EXPECT_EQ(config->endpoint, "https://s3.us-east-1.amazonaws.com");
  EXPECT_FALSE(config->path_style);
  EXPECT_EQ(config->ca_bundle, "");
  EXPECT_FALSE(config->anonymous);
  EXPECT_EQ(config->DebugString(),
            "profile=default region=us-east-1 endpoint=https://s3.us-east-1.amazonaws.com "
            "addressing=virtual ca_bundle=(system) credentials=environment (AWS_ACCESS_KEY_ID)");
}

TEST_F(AwsConfigTest, CredentialPrecedence) {
  WriteConfig(absl::StrCat(
      "[default]\naws_access_key_id = AKIACONFIG\naws_secret_access_key = ", kConfigSecret, "\n"));
  {
    absl::StatusOr<S3ClientConfig> config = Resolve();
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->credentials.access_key_id, "AKIACONFIG");
    EXPECT_EQ(config->credentials.secret_access_key, kConfigSecret);
    EXPECT_EQ(config->credentials_source, absl::StrCat("profile 'default' in ", config_path()));
  }
  WriteCredentials(absl::StrCat("[default]\naws_access_key_id = AKIAFILE\n",
                                "aws_secret_access_key = ", kFileSecret, "\n",
                                "aws_session_token = ", kToken, "\n"));
  {
    absl::StatusOr<S3ClientConfig> config = Resolve();
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->credentials.access_key_id, "AKIAFILE");
    EXPECT_EQ(config->credentials.secret_access_key, kFileSecret);
    EXPECT_EQ(config->credentials.session_token, kToken);
    EXPECT_EQ(config->credentials_source,
              absl::StrCat("profile 'default' in ", credentials_path()));
  }
  SetEnvCredentials();
  {
    absl::StatusOr<S3ClientConfig> config = Resolve();
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->credentials.access_key_id, "AKIAENV");
    // The file's token does not leak into the environment's key pair.
    EXPECT_EQ(config->credentials.session_token, "");
  }
  env_["AWS_SESSION_TOKEN"] = kToken;
  {
    absl::StatusOr<S3ClientConfig> config = Resolve();
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->credentials.session_token, kToken);
  }
  S3ClientOverrides overrides;
  overrides.access_key_id = "AKIAOVERRIDE";
  overrides.secret_access_key = kOverrideSecret;
  {
    absl::StatusOr<S3ClientConfig> config = Resolve(overrides);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->credentials.access_key_id, "AKIAOVERRIDE");
    EXPECT_EQ(config->credentials.secret_access_key, kOverrideSecret);
    EXPECT_EQ(config->credentials.session_token, "");
    EXPECT_EQ(config->credentials_source, "explicit options");
  }
}

TEST_F(AwsConfigTest, EmptyValuesCountAsUnset) {
  env_["AWS_ACCESS_KEY_ID"] = "";
  env_["AWS_SECRET_ACCESS_KEY"] = "";
  env_["AWS_PROFILE"] = "";
  env_["AWS_REGION"] = "";
  WriteCredentials(absl::StrCat("[default]\naws_access_key_id = AKIAFILE\n",
                                "aws_secret_access_key = ", kFileSecret, "\n"));
  S3ClientOverrides overrides;
  overrides.access_key_id = "";
  overrides.region = "";
  absl::StatusOr<S3ClientConfig> config = Resolve(overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->credentials.access_key_id, "AKIAFILE");
  EXPECT_EQ(config->profile, "default");
  EXPECT_EQ(config->region, "us-east-1");
}

TEST_F(AwsConfigTest, ProfileSelectionAndFileSectionNames) {
  WriteCredentials(absl::StrCat(
      "[default]\naws_access_key_id = AKIADEFAULT\n", "aws_secret_access_key = ", kFileSecret, "\n",
      "[dev]\naws_access_key_id = AKIADEV\n", "aws_secret_access_key = ", kFileSecret, "\n"));
  WriteConfig(
      "[default]\nregion = us-west-1\n"
      "[profile dev]\nregion = eu-west-1\n"
      "[profile  ops ]\nregion = ap-south-1\naws_access_key_id = AKIAOPS\n"
      "aws_secret_access_key = x\n");
  {
    absl::StatusOr<S3ClientConfig> config = Resolve();
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->profile, "default");
    EXPECT_EQ(config->credentials.access_key_id, "AKIADEFAULT");
    EXPECT_EQ(config->region, "us-west-1");
  }
  env_["AWS_PROFILE"] = "dev";
  {
    absl::StatusOr<S3ClientConfig> config = Resolve();
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->profile, "dev");
    EXPECT_EQ(config->credentials.access_key_id, "AKIADEV");
    EXPECT_EQ(config->credentials_source, absl::StrCat("profile 'dev' in ", credentials_path()));
    EXPECT_EQ(config->region, "eu-west-1");
  }
  S3ClientOverrides overrides;
  overrides.profile = "ops";  // beats AWS_PROFILE; only in the config file, with odd spacing
  {
    absl::StatusOr<S3ClientConfig> config = Resolve(overrides);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->profile, "ops");
    EXPECT_EQ(config->credentials.access_key_id, "AKIAOPS");
    EXPECT_EQ(config->credentials_source, absl::StrCat("profile 'ops' in ", config_path()));
    EXPECT_EQ(config->region, "ap-south-1");
  }
}

TEST_F(AwsConfigTest, AnExplicitProfileBeatsTheEnvironmentsKeysButAwsProfileDoesNot) {
  SetEnvCredentials();
  WriteCredentials(absl::StrCat("[dev]\naws_access_key_id = AKIADEV\n",
                                "aws_secret_access_key = ", kFileSecret, "\n"));
  env_["AWS_PROFILE"] = "dev";
  {
    // As boto3: AWS_PROFILE picks settings, the environment's keys still win.
    absl::StatusOr<S3ClientConfig> config = Resolve();
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_NE(config->credentials.access_key_id, "AKIADEV");
  }
  S3ClientOverrides overrides;
  overrides.profile = "dev";  // Session(profile_name="dev"): the profile's keys
  absl::StatusOr<S3ClientConfig> config = Resolve(overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->credentials.access_key_id, "AKIADEV");
  EXPECT_EQ(config->credentials_source, absl::StrCat("profile 'dev' in ", credentials_path()));
}

TEST_F(AwsConfigTest, ProfileDefaultSectionWinsOverDefault) {
  SetEnvCredentials();
  WriteConfig("[default]\nregion = us-west-1\n[profile default]\nregion = us-west-2\n");
  absl::StatusOr<S3ClientConfig> config = Resolve();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->region, "us-west-2");
}

TEST_F(AwsConfigTest, CredentialsFileSettingsOtherThanKeysAreIgnored) {
  SetEnvCredentials();
  WriteCredentials("[default]\nregion = eu-central-1\nendpoint_url = http://ignored:1\n");
  absl::StatusOr<S3ClientConfig> config = Resolve();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->region, "us-east-1");
  EXPECT_EQ(config->endpoint, "https://s3.us-east-1.amazonaws.com");
}

TEST_F(AwsConfigTest, MissingNamedProfileIsAFailedPrecondition) {
  SetEnvCredentials();
  WriteCredentials("[default]\n");
  env_["AWS_PROFILE"] = "nope";
  absl::StatusOr<S3ClientConfig> config = Resolve();
  EXPECT_EQ(config.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(config.status().message(),
            absl::StrCat("AWS profile 'nope' (from AWS_PROFILE) not found in ", credentials_path(),
                         " or ", config_path(), " (does not exist)"));

  S3ClientOverrides overrides;
  overrides.profile = "other";
  config = Resolve(overrides);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(config.status().message(), HasSubstr("'other' (from explicit options)"));
}

TEST_F(AwsConfigTest, MissingNamedProfileHintsAtProfilePrefix) {
  SetEnvCredentials();
  WriteConfig("[dev]\nregion = eu-west-1\n");
  env_["AWS_PROFILE"] = "dev";
  absl::StatusOr<S3ClientConfig> config = Resolve();
  EXPECT_EQ(config.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(config.status().message(), HasSubstr("it must be written [profile dev]"));
}

TEST_F(AwsConfigTest, MissingDefaultProfileIsFine) {
  SetEnvCredentials();
  WriteConfig("[profile dev]\nregion = eu-west-1\n");
  absl::StatusOr<S3ClientConfig> config = Resolve();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->region, "us-east-1");
}

TEST_F(AwsConfigTest, NoCredentialsIsUnauthenticated) {
  WriteConfig("[default]\nregion = us-west-2\n");
  // Instance metadata is the last resort (NoCredentialsFallsBackToInstanceMetadata).
  env_["AWS_EC2_METADATA_DISABLED"] = "true";
  absl::StatusOr<S3ClientConfig> config = Resolve();
  EXPECT_EQ(config.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(config.status().message(),
            "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE, or ~/.aws/credentials");
}

TEST_F(AwsConfigTest, NoCredentialsFallsBackToInstanceMetadata) {
  WriteConfig("[default]\nregion = us-west-2\n");
  // Chosen, not fetched: resolving never contacts the address.
  absl::StatusOr<S3ClientConfig> config = Resolve();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->credentials.empty());
  ASSERT_NE(config->credentials_provider, nullptr);
  EXPECT_EQ(config->credentials_source, "IMDS at http://169.254.169.254");
  EXPECT_EQ(config->credentials_provider->Describe(), config->credentials_source);
}

TEST_F(AwsConfigTest, StaticKeysComeWithAProviderThatHandsThemOut) {
  SetEnvCredentials();
  absl::StatusOr<S3ClientConfig> config = Resolve();
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_NE(config->credentials_provider, nullptr);
  EXPECT_EQ(config->credentials_provider->Describe(), "environment (AWS_ACCESS_KEY_ID)");
  absl::StatusOr<Credentials> fetched = config->credentials_provider->Fetch();
  ASSERT_TRUE(fetched.ok());
  EXPECT_EQ(fetched->access_key_id, "AKIAENV");

  S3ClientOverrides overrides;
  overrides.access_key_id = "AKIAOVERRIDE";
  overrides.secret_access_key = kOverrideSecret;
  config = Resolve(overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->credentials_provider->Describe(), "explicit options");
  EXPECT_EQ(config->credentials_provider->Fetch()->access_key_id, "AKIAOVERRIDE");

  overrides.anonymous = true;
  config = Resolve(overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->credentials_provider, nullptr);
}

TEST_F(AwsConfigTest, ProfilesThatFetchCredentialsResolveToAProvider) {
  WriteCredentials(absl::StrCat("[base]\naws_access_key_id = AKIABASE\n",
                                "aws_secret_access_key = ", kFileSecret, "\n"));
  WriteConfig(
      "[profile role]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = base\n"
      "region = eu-west-1\n"
      "[profile proc]\ncredential_process = /bin/false\n"
      "[profile web]\nrole_arn = arn:aws:iam::1:role/w\n"
      "web_identity_token_file = /var/run/secrets/token\n");
  S3ClientOverrides overrides;
  overrides.profile = "role";
  absl::StatusOr<S3ClientConfig> config = Resolve(overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->credentials.empty());
  // STS is regional, in the profile's region.
  EXPECT_EQ(config->credentials_source,
            absl::StrCat("role arn:aws:iam::1:role/r via STS at "
                         "https://sts.eu-west-1.amazonaws.com with profile 'base' in ",
                         credentials_path()));
  overrides.profile = "proc";
  config = Resolve(overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->credentials_source,
            absl::StrCat("credential_process of profile 'proc' in ", config_path()));
  overrides.profile = "web";
  env_["AWS_ENDPOINT_URL_STS"] = "http://127.0.0.1:4566/";
  config = Resolve(overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->credentials_source,
            "web identity token /var/run/secrets/token for role arn:aws:iam::1:role/w via STS "
            "at http://127.0.0.1:4566");
  // The S3 endpoint is not STS's.
  EXPECT_EQ(config->endpoint, "https://s3.us-east-1.amazonaws.com");
}

TEST_F(AwsConfigTest, UnsupportedCredentialProviderGivesHint) {
  WriteConfig("[profile sso]\nsso_session = corp\nregion = us-west-2\n");
  S3ClientOverrides overrides;
  overrides.profile = "sso";
  absl::StatusOr<S3ClientConfig> config = Resolve(overrides);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(config.status().message(), HasSubstr("sso_session"));
  EXPECT_THAT(config.status().message(),
              HasSubstr("aws configure export-credentials --profile sso"));
}

TEST_F(AwsConfigTest, AnonymousNeedsNoCredentials) {
  SetEnvCredentials();
  S3ClientOverrides overrides;
  overrides.anonymous = true;
  absl::StatusOr<S3ClientConfig> config = Resolve(overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->anonymous);
  EXPECT_TRUE(config->credentials.empty());
  EXPECT_EQ(config->credentials_source, "anonymous (requests are not signed)");

  env_.clear();  // no HOME, no files, no keys
  config = Resolve(overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->endpoint, "https://s3.us-east-1.amazonaws.com");
}

TEST_F(AwsConfigTest, PartialCredentialsNameWhatIsMissing) {
  {
    S3ClientOverrides overrides;
    overrides.access_key_id = "AKIAOVERRIDE";
    absl::StatusOr<S3ClientConfig> config = Resolve(overrides);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(config.status().message(),
              "explicit options: access_key_id is set but secret_access_key is missing; set both "
              "or neither");
  }
  {
    S3ClientOverrides overrides;
    overrides.secret_access_key = kOverrideSecret;
    absl::StatusOr<S3ClientConfig> config = Resolve(overrides);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(),
                HasSubstr("secret_access_key is set but access_key_id is missing"));
  }
  {
    S3ClientOverrides overrides;
    overrides.session_token = kToken;
    absl::StatusOr<S3ClientConfig> config = Resolve(overrides);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr("session_token is set without"));
  }
  env_["AWS_SECRET_ACCESS_KEY"] = kEnvSecret;
  {
    absl::StatusOr<S3ClientConfig> config = Resolve();
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(config.status().message(),
              "environment (AWS_ACCESS_KEY_ID): AWS_SECRET_ACCESS_KEY is set but "
              "AWS_ACCESS_KEY_ID is missing; set both or neither");
  }
  env_.erase("AWS_SECRET_ACCESS_KEY");
  env_["AWS_ACCESS_KEY_ID"] = "AKIAENV";
  {
    absl::StatusOr<S3ClientConfig> config = Resolve();
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(),
                HasSubstr("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is missing"));
  }
  env_.erase("AWS_ACCESS_KEY_ID");
  WriteCredentials(absl::StrCat("[default]\naws_secret_access_key = ", kFileSecret, "\n"));
  {
    absl::StatusOr<S3ClientConfig> config = Resolve();
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(config.status().message(),
              absl::StrCat("profile 'default' in ", credentials_path(),
                           ": aws_secret_access_key is set but aws_access_key_id is missing; set "
                           "both or neither"));
  }
}

TEST_F(AwsConfigTest, RegionPrecedence) {
  SetEnvCredentials();
  WriteConfig("[default]\nregion = eu-west-3\n");
  EXPECT_EQ(Resolve()->region, "eu-west-3");
  env_["AWS_DEFAULT_REGION"] = "eu-west-2";
  EXPECT_EQ(Resolve()->region, "eu-west-2");
  env_["AWS_REGION"] = "eu-west-1";
  EXPECT_EQ(Resolve()->region, "eu-west-1");
  S3ClientOverrides overrides;
  overrides.region = "ap-northeast-1";
  absl::StatusOr<S3ClientConfig> config = Resolve(overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->region, "ap-northeast-1");
  EXPECT_EQ(config->endpoint, "https://s3.ap-northeast-1.amazonaws.com");

  overrides.region = "us-east-1/evil";
  config = Resolve(overrides);
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("(from explicit options)"));
}

TEST_F(AwsConfigTest, ChinaRegionsUseTheirOwnDomain) {
  SetEnvCredentials();
  env_["AWS_REGION"] = "cn-north-1";
  absl::StatusOr<S3ClientConfig> config = Resolve();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->endpoint, "https://s3.cn-north-1.amazonaws.com.cn");
  EXPECT_FALSE(config->path_style);
}

TEST_F(AwsConfigTest, EndpointPrecedence) {
  SetEnvCredentials();
  WriteConfig(
      "[default]\n"
      "endpoint_url = http://profile-global:1\n"
      "services = local\n"
      "s3 =\n"
      "  endpoint_url = http://profile-nested:2\n"
      "[services local]\n"
      "s3 =\n"
      "  endpoint_url = http://services-s3:3/\n");
  EXPECT_EQ(Resolve()->endpoint, "http://services-s3:3");
  WriteConfig(
      "[default]\n"
      "endpoint_url = http://profile-global:1\n"
      "s3 =\n"
      "  endpoint_url = http://profile-nested:2\n");
  EXPECT_EQ(Resolve()->endpoint, "http://profile-nested:2");
  WriteConfig("[default]\nendpoint_url = http://profile-global:1\n");
  EXPECT_EQ(Resolve()->endpoint, "http://profile-global:1");
  env_["AWS_ENDPOINT_URL"] = "http://env-global:4";
  EXPECT_EQ(Resolve()->endpoint, "http://env-global:4");
  env_["AWS_ENDPOINT_URL_S3"] = "HTTPS://env-s3:5//";
  EXPECT_EQ(Resolve()->endpoint, "https://env-s3:5");
  S3ClientOverrides overrides;
  overrides.endpoint_url = "http://[::1]:9000/";
  EXPECT_EQ(Resolve(overrides)->endpoint, "http://[::1]:9000");
}

TEST_F(AwsConfigTest, InvalidEndpointsAreRejected) {
  SetEnvCredentials();
  struct Case {
    std::string endpoint;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"localhost:9000",
       "endpoint 'localhost:9000' (from explicit options) must start with http:// or https://"},
      {"ftp://h", "must start with http:// or https://"},
      {"http://", "has no host"},
      {"http:///x", "without a path, query or user name"},
      {"http://h:9000/prefix", "without a path, query or user name"},
      {"http://h?x=1", "without a path, query or user name"},
      {"http://h x", "without a path, query or user name"},
      {absl::StrCat("http://AKIA:", kOverrideSecret, "@h"),
       "the endpoint from explicit options must not contain a user name or password"},
  };
  for (const Case& c : cases) {
    S3ClientOverrides overrides;
    overrides.endpoint_url = c.endpoint;
    absl::StatusOr<S3ClientConfig> config = Resolve(overrides);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << c.endpoint;
    EXPECT_THAT(config.status().message(), HasSubstr(c.message)) << c.endpoint;
  }
  env_["AWS_ENDPOINT_URL"] = "minio:9000";
  EXPECT_THAT(Resolve().status().message(), HasSubstr("(from AWS_ENDPOINT_URL)"));
}

TEST_F(AwsConfigTest, PathStylePrecedence) {
  SetEnvCredentials();
  // AWS endpoint: virtual-hosted by default.
  EXPECT_FALSE(Resolve()->path_style);
  // Custom endpoint: path style by default.
  env_["AWS_ENDPOINT_URL"] = "http://localhost:9000";
  EXPECT_TRUE(Resolve()->path_style);
  // An explicit AWS endpoint is still AWS.
  env_["AWS_ENDPOINT_URL"] = "https://s3.dualstack.eu-west-1.amazonaws.com";
  EXPECT_FALSE(Resolve()->path_style);
  // The profile's nested addressing_style beats the endpoint heuristic...
  WriteConfig("[default]\ns3 =\n  addressing_style = path\n");
  EXPECT_TRUE(Resolve()->path_style);
  env_["AWS_ENDPOINT_URL"] = "http://localhost:9000";
  WriteConfig("[default]\ns3 =\n  addressing_style = virtual\n");
  EXPECT_FALSE(Resolve()->path_style);
  WriteConfig("[default]\ns3 =\n  addressing_style = auto\n");
  EXPECT_TRUE(Resolve()->path_style);
  // ... and the override beats the profile.
  WriteConfig("[default]\ns3 =\n  addressing_style = virtual\n");
  S3ClientOverrides overrides;
  overrides.path_style = true;
  EXPECT_TRUE(Resolve(overrides)->path_style);
  overrides.path_style = false;
  env_.erase("AWS_ENDPOINT_URL");
  WriteConfig("[default]\ns3 =\n  addressing_style = path\n");
  EXPECT_FALSE(Resolve(overrides)->path_style);

  WriteConfig("[default]\ns3 =\n  addressing_style = sideways\n");
  absl::StatusOr<S3ClientConfig> config = Resolve();
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("addressing_style 'sideways'"));
}

TEST_F(AwsConfigTest, CaBundlePrecedence) {
  SetEnvCredentials();
  WriteConfig("[default]\nca_bundle = /profile/ca.pem\n");
  EXPECT_EQ(Resolve()->ca_bundle, "/profile/ca.pem");
  env_["AWS_CA_BUNDLE"] = "/env/ca.pem";
  EXPECT_EQ(Resolve()->ca_bundle, "/env/ca.pem");
  S3ClientOverrides overrides;
  overrides.ca_bundle = "/override/ca.pem";
  EXPECT_EQ(Resolve(overrides)->ca_bundle, "/override/ca.pem");
}

TEST_F(AwsConfigTest, FileLocationsFromEnvironment) {
  const std::string credentials = home_ + "/creds-elsewhere";
  const std::string config = home_ + "/config-elsewhere";
  WriteFile(credentials, absl::StrCat("[default]\naws_access_key_id = AKIAELSEWHERE\n",
                                      "aws_secret_access_key = ", kFileSecret, "\n"));
  WriteFile(config, "[default]\nregion = sa-east-1\n");
  env_["AWS_SHARED_CREDENTIALS_FILE"] = "~/creds-elsewhere";  // '~' is expanded with HOME
  env_["AWS_CONFIG_FILE"] = config;
  absl::StatusOr<S3ClientConfig> resolved = Resolve();
  unlink(credentials.c_str());
  unlink(config.c_str());
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->credentials.access_key_id, "AKIAELSEWHERE");
  EXPECT_EQ(resolved->credentials_source, absl::StrCat("profile 'default' in ", credentials));
  EXPECT_EQ(resolved->region, "sa-east-1");
}

TEST_F(AwsConfigTest, WithoutHomeOnlyTheEnvironmentCounts) {
  env_.erase("HOME");
  SetEnvCredentials();
  absl::StatusOr<S3ClientConfig> config = Resolve();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->credentials.access_key_id, "AKIAENV");

  env_["AWS_PROFILE"] = "dev";
  config = Resolve();
  EXPECT_EQ(config.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(config.status().message(), HasSubstr("HOME is not set"));
}

TEST_F(AwsConfigTest, MalformedFileNamesPathAndLineWithoutTheSecret) {
  WriteCredentials(absl::StrCat("[default]\naws_access_key_id = AKIAFILE\n",
                                "aws_secret_access_key ", kFileSecret, "\n"));
  absl::StatusOr<S3ClientConfig> config = Resolve();
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(config.status().message(),
            absl::StrCat("parsing ", credentials_path(), ": line 3: expected 'name = value'"));
}

TEST_F(AwsConfigTest, UnreadableFileIsAnError) {
  SetEnvCredentials();
  env_["AWS_CONFIG_FILE"] = home_;  // a directory: open succeeds, read fails
  absl::StatusOr<S3ClientConfig> config = Resolve();
  EXPECT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr(absl::StrCat("reading ", home_)));
}

TEST_F(AwsConfigTest, DefaultEnvLookupReadsTheProcessEnvironment) {
  ASSERT_EQ(setenv("WHARF_AWS_CONFIG_TEST_VAR", "value", 1), 0);
  EXPECT_EQ(GetEnv("WHARF_AWS_CONFIG_TEST_VAR"), "value");
  unsetenv("WHARF_AWS_CONFIG_TEST_VAR");
  EXPECT_EQ(GetEnv("WHARF_AWS_CONFIG_TEST_VAR"), std::nullopt);
}

}  // namespace
}  // namespace wharf::s3
