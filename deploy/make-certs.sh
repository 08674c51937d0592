#!/usr/bin/env bash
# Makes a small private CA and the certificates a fusor deployment needs,
# for trying TLS and mutual TLS (use your organisation's CA in production):
#   ca.pem                       the CA certificate (clients: --tls-ca; scheduler: --tls-client-ca)
#   scheduler.pem scheduler.key  the scheduler's (--tls-cert, --tls-key), valid for localhost,
#                                127.0.0.1 and every NAME given (DNS names or IP addresses)
#   client.pem client.key        a certificate for clients and workers under mutual TLS
# Usage: deploy/make-certs.sh DIR [NAME ...]   (existing files in DIR are replaced)
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [NAME ...]" >&2
  exit 2
fi
dir="$1"
shift
mkdir -p "$dir"
cd "$dir"
umask 077

sans="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
  if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then
    sans="$sans,IP:$name"
  else
    sans="$sans,DNS:$name"
  fi
done

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2> /dev/null; }

key ca.key
openssl req -x509 -new -key ca.key -sha256 -days 825 -subj "/CN=fusor CA" -out ca.pem \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

# sign NAME CN EXTENSIONS
sign() {
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -sha256 -days 825 -out "$1.pem" \
    -extfile <(printf '%s\n' "$3") 2> /dev/null
  rm -f "$1.csr"
}
sign scheduler "fusor-scheduler" "subjectAltName=$sans
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature"
sign client "fusor-client" "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature"
rm -f ca.srl
chmod 644 ca.pem scheduler.pem client.pem
echo "make-certs: wrote ca.pem, scheduler.pem/.key ($sans), client.pem/.key in $dir"
