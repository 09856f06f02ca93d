#!/usr/bin/env bash
# Makes what a flashdraft job needs for TLS, mutual TLS and the job secret, with the openssl CLI:
#   ca.pem / ca.key            a private CA for this cluster (keep ca.key offline once done)
#   coordinator.pem / .key     the coordinator's certificate (server), for the names and IPs given
#   worker.pem / worker.key    a client certificate for workers and `flashdraft status` (mutual TLS)
#   token                      the job secret (64 hex characters, mode 600)
#   feeder-HOST.pem / .key     with --feeder HOST: a target feeder's certificate, both a client (to
#                              the coordinator) and the server workers fetch shards from, for HOST
#                              (a DNS name or an IP) and localhost/127.0.0.1
# Usage: deploy/make-certs.sh OUT_DIR [--name DNS_NAME]... [--ip IP]... [--days N]
#        [--client NAME]...   (more client certificates: NAME.pem / NAME.key, signed by the same CA)
#        [--feeder HOST]...
# localhost and 127.0.0.1 are always in the coordinator's certificate (flashdraft launch connects
# its workers there). Existing files are kept: run it again to add a client; delete the directory
# to start over. docs/SECURITY.md says how to use and rotate them.
set -euo pipefail

usage() { sed -n '2,16p' "$0" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
out=$1
shift
names=(localhost)
ips=(127.0.0.1)
clients=(worker)
feeders=()
days=365
while [[ $# -gt 0 ]]; do
  case $1 in
    --name) names+=("$2"); shift 2 ;;
    --ip) ips+=("$2"); shift 2 ;;
    --client) clients+=("$2"); shift 2 ;;
    --feeder)
      [[ $2 =~ ^[A-Za-z0-9.:-]+$ ]] || { echo "make-certs: --feeder '$2' is not a host name or IP" >&2; exit 2; }
      feeders+=("$2"); shift 2 ;;
    --days) days=$2; shift 2 ;;
    *) echo "make-certs: unknown argument '$1'" >&2; usage ;;
  esac
done
command -v openssl >/dev/null || { echo "make-certs: needs the openssl CLI (apt install openssl)" >&2; exit 1; }

mkdir -p "$out"
chmod 700 "$out"
cd "$out"
umask 077
newkey=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)

if [[ ! -f ca.pem ]]; then
  openssl req -x509 "${newkey[@]}" -keyout ca.key -out ca.pem -days "$days" \
    -subj "/CN=flashdraft cluster CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
  echo "make-certs: made the CA $out/ca.pem"
fi

# sign NAME SUBJECT EXTENSIONS: NAME.pem / NAME.key signed by the CA.
sign() {
  local name=$1 subject=$2 ext=$3
  [[ -f $name.pem ]] && return 0
  openssl req "${newkey[@]}" -keyout "$name.key" -out "$name.csr" -subj "$subject" 2>/dev/null
  printf '%s\n' "$ext" >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" \
    -extfile "$name.ext" -out "$name.pem" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
  echo "make-certs: made $out/$name.pem"
}

san=""
for n in "${names[@]}"; do san+="${san:+,}DNS:$n"; done
for i in "${ips[@]}"; do san+="${san:+,}IP:$i"; done
sign coordinator "/CN=flashdraft-coordinator" \
  "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$san"
for c in "${clients[@]}"; do
  sign "$c" "/CN=flashdraft-$c" \
    "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
done

for f in "${feeders[@]}"; do
  if [[ $f =~ ^[0-9.]+$ || $f == *:* ]]; then host="IP:$f"; else host="DNS:$f"; fi
  sign "feeder-$f" "/CN=flashdraft-feeder-$f" \
    "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$host,DNS:localhost,IP:127.0.0.1"
done

if [[ ! -f token ]]; then
  openssl rand -hex 32 >token
  echo "make-certs: made the job secret $out/token"
fi
chmod 600 ./*.key token
chmod 644 ./*.pem
