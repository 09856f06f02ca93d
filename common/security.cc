#include "common/security.h"

#include <grpcpp/support/client_interceptor.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/grpc_options.h"
#include "glog/logging.h"

namespace flashdraft {
namespace {

constexpr char kAuthorization[] = "authorization";
constexpr char kBearer[] = "Bearer ";
constexpr size_t kMinTokenChars = 16;

// The newest OpenSSL error, for messages; clears the queue.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no details";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

std::string TimeString(const ASN1_TIME* t) {
  BIO* bio = BIO_new(BIO_s_mem());
  ASN1_TIME_print(bio, t);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string out(data, n > 0 ? static_cast<size_t>(n) : 0);
  BIO_free(bio);
  return out;
}

std::string SubjectString(X509* cert) {
  char* name = X509_NAME_oneline(X509_get_subject_name(cert), nullptr, 0);
  std::string out = name != nullptr ? name : "?";
  OPENSSL_free(name);
  return out;
}

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

// Every certificate in `pem`, each valid now; an error names `path` and `what`.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(const std::string& pem,
                                                       const std::string& path,
                                                       const std::string& what) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  std::vector<X509Ptr> certs;
  while (X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) certs.emplace_back(x);
  BIO_free(bio);
  ERR_clear_error();  // the end of the file reads as an error
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", path, " holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
  }
  for (const X509Ptr& cert : certs) {
    if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the certificate ", SubjectString(cert.get()), " in ", path,
                       " expired on ", TimeString(X509_get0_notAfter(cert.get()))));
    }
    if (X509_cmp_current_time(X509_get0_notBefore(cert.get())) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the certificate ", SubjectString(cert.get()), " in ", path,
                       " is not valid before ", TimeString(X509_get0_notBefore(cert.get()))));
    }
  }
  return certs;
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no file given"));
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot read ", path, ": ", text.status().message()));
  }
  return text;
}

// Adds "authorization: Bearer <token>" to every call of a channel.
class TokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorization, *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token) : header_(kBearer + std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;
};

}  // namespace

absl::StatusOr<TlsIdentity> ReadTlsIdentity(const std::string& cert_path,
                                            const std::string& key_path, const std::string& what) {
  TlsIdentity id;
  const std::string cert_what = absl::StrCat(what, " certificate");
  const std::string key_what = absl::StrCat(what, " key");
  auto cert_pem = ReadPem(cert_path, cert_what);
  if (!cert_pem.ok()) return cert_pem.status();
  id.cert_chain_pem = *std::move(cert_pem);
  auto key_pem = ReadPem(key_path, key_what);
  if (!key_pem.ok()) return key_pem.status();
  id.private_key_pem = *std::move(key_pem);
  auto certs = ParseCertificates(id.cert_chain_pem, cert_path, cert_what);
  if (!certs.ok()) return certs.status();
  BIO* bio =
      BIO_new_mem_buf(id.private_key_pem.data(), static_cast<int>(id.private_key_pem.size()));
  // No passphrase prompt: an encrypted key fails here instead of waiting on a terminal.
  EVP_PKEY* key = PEM_read_bio_PrivateKey(
      bio, nullptr, [](char*, int, int, void*) { return 0; }, nullptr);
  BIO_free(bio);
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        key_what, ": ", key_path,
        " holds no unencrypted PEM private key (-----BEGIN PRIVATE KEY-----): ", OpenSslError()));
  }
  const bool matches = X509_check_private_key(certs->front().get(), key) == 1;
  EVP_PKEY_free(key);
  ERR_clear_error();
  if (!matches) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_what, ": the key in ", key_path, " does not belong to the certificate ",
                     SubjectString(certs->front().get()), " in ", cert_path));
  }
  return id;
}

absl::StatusOr<std::string> ReadCaBundle(const std::string& path, const std::string& what) {
  auto pem = ReadPem(path, what);
  if (!pem.ok()) return pem.status();
  auto certs = ParseCertificates(*pem, path, what);
  if (!certs.ok()) return certs.status();
  return pem;
}

absl::StatusOr<std::string> ReadToken(const std::string& path, const std::string& what) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read ", path));
  }
  if ((st.st_mode & 0007) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", path, " is accessible by every user of this host (mode ",
                     absl::StrFormat("%o", st.st_mode & 0777), "); chmod 600 it"));
  }
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot read ", path, ": ", text.status().message()));
  }
  std::string token(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
  if (token.size() < kMinTokenChars) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the secret in ", path, " is shorter than ", kMinTokenChars,
                     " characters (make one with: openssl rand -hex 32 > ", path, ")"));
  }
  for (char ch : token) {
    if (ch < 0x21 || ch > 0x7e) {  // what an HTTP/2 header value may carry
      return absl::InvalidArgumentError(absl::StrCat(what, ": the secret in ", path,
                                                     " has characters other than printable ASCII"));
    }
  }
  return token;
}

std::string Untrusted(absl::string_view text, size_t max_chars) {
  std::string out = absl::CHexEscape(text.substr(0, max_chars));
  if (text.size() > max_chars) out += "...";
  return out;
}

bool SecretEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) {
    // Spend the same time as an equal-length compare, then refuse.
    (void)CRYPTO_memcmp(b.data(), b.data(), b.size());
    return false;
  }
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

ClientSecurity ClientSecurityFor(const SecurityConfig& s) {
  ClientSecurity c;
  c.tls_ca = s.tls_ca;
  if (s.client_auth) {
    c.tls_cert = s.client_cert;
    c.tls_key = s.client_key;
  }
  c.server_name = s.server_name;
  c.token_file = s.token_file;
  return c;
}

absl::StatusOr<ClientSecurity> ClientSecurityFromJob(const std::string& job_path,
                                                     const ClientSecurity& flags) {
  if (job_path.empty()) return flags;
  absl::StatusOr<JobConfig> job = LoadJobConfig(job_path);
  if (!job.ok()) return job.status();
  return ClientSecurityFor(job->security);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateSecureChannel(const std::string& address,
                                                                   const ClientSecurity& s,
                                                                   int connection) {
  grpc::ChannelArguments args = ClientChannelArguments();
  if (connection != 0) args.SetInt("flashdraft.connection", connection);
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (s.tls()) {
    grpc::SslCredentialsOptions options;
    auto ca = ReadCaBundle(s.tls_ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
    if (!s.tls_cert.empty() || !s.tls_key.empty()) {
      auto id = ReadTlsIdentity(s.tls_cert, s.tls_key, "--tls-cert/--tls-key");
      if (!id.ok()) return id.status();
      options.pem_cert_chain = id->cert_chain_pem;
      options.pem_private_key = id->private_key_pem;
    }
    if (!s.server_name.empty()) args.SetSslTargetNameOverride(s.server_name);
    credentials = grpc::SslCredentials(options);
  } else {
    if (!s.tls_cert.empty()) {
      return absl::InvalidArgumentError("--tls-cert needs --tls-ca (the coordinator's CA)");
    }
    credentials = grpc::InsecureChannelCredentials();
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!s.token_file.empty()) {
    auto token = ReadToken(s.token_file, "--token-file");
    if (!token.ok()) return token.status();
    interceptors.push_back(std::make_unique<TokenInterceptorFactory>(*std::move(token)));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args,
                                                                 std::move(interceptors));
}

absl::StatusOr<std::unique_ptr<ServerSecurity>> ServerSecurity::Create(const SecurityConfig& s,
                                                                       const Clock& clock) {
  std::unique_ptr<ServerSecurity> out(new ServerSecurity(clock));
  std::vector<std::string> parts;
  if (!s.tls_cert.empty()) {
    auto id = ReadTlsIdentity(s.tls_cert, s.tls_key, "security.tls_cert/tls_key");
    if (!id.ok()) return id.status();
    const bool mutual = s.client_auth && !s.tls_ca.empty();
    grpc::SslServerCredentialsOptions options(
        mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
               : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    if (!s.tls_ca.empty()) {
      auto ca = ReadCaBundle(s.tls_ca, "security.tls_ca");
      if (!ca.ok()) return ca.status();
      options.pem_root_certs = *std::move(ca);
    }
    options.pem_key_cert_pairs.push_back({id->private_key_pem, id->cert_chain_pem});
    out->credentials_ = grpc::SslServerCredentials(options);
    parts.push_back(mutual ? "mutual TLS" : "TLS");
  } else {
    out->credentials_ = grpc::InsecureServerCredentials();
    parts.push_back("no TLS");
  }
  if (!s.token_file.empty()) {
    auto token = ReadToken(s.token_file, "security.token_file");
    if (!token.ok()) return token.status();
    out->expected_header_ = kBearer + *std::move(token);
    parts.push_back("job token");
  } else {
    parts.push_back("no token");
  }
  if (s.insecure) parts.push_back("insecure allowed");
  out->description_ = absl::StrJoin(parts, ", ");
  return out;
}

grpc::Status ServerSecurity::Authenticate(const grpc::ServerContextBase& context) {
  if (expected_header_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorization);
  const bool present = it != metadata.end();
  if (present &&
      SecretEquals(absl::string_view(it->second.data(), it->second.size()), expected_header_)) {
    return grpc::Status::OK;
  }
  const std::string why = present ? "a wrong job token" : "no job token";
  LogRefusal(context.peer(), why);
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      absl::StrCat("refused: ", why, " (the job's security.token_file)"));
}

void ServerSecurity::LogRefusal(const std::string& peer, const std::string& why) {
  absl::MutexLock lock(&mu_);
  const double now = clock_.Now();
  if (now - last_log_ < 1.0) {
    ++suppressed_;
    return;
  }
  LOG(WARNING) << "refused a call from " << peer.substr(0, 128) << ": " << why
               << (suppressed_ > 0 ? absl::StrCat(" (and ", suppressed_, " more refused calls)")
                                   : std::string());
  last_log_ = now;
  suppressed_ = 0;
}

}  // namespace flashdraft
