# Google application-default credentials for the JSON API (service-account JWTs signed with
# OpenSSL, gcloud user credentials, the GCE metadata server), as CredentialsProviders.
add_library(wharf_gcs_auth gcs_credentials.cc)
target_link_libraries(wharf_gcs_auth PUBLIC wharf_base wharf_http absl::status absl::statusor
  absl::strings absl::time PRIVATE OpenSSL::Crypto nlohmann_json::nlohmann_json)

# Each source against a loopback stand-in of its token endpoint; the service-account endpoint
# verifies the RS256 signature with the key's public half.
wharf_test(gcs_credentials_test SOURCES gcs_credentials_test.cc
  DEPS wharf_gcs_auth OpenSSL::Crypto nlohmann_json::nlohmann_json)
