package identity

import (
	"encoding/base64"
	"math/big"
)

// Discovery is the issuer's OpenID Provider metadata
// (/.well-known/openid-configuration), with what cloud providers' OIDC
// federation reads.
type Discovery struct {
	Issuer          string   `json:"issuer"`
	JWKSURI         string   `json:"jwks_uri"`
	ResponseTypes   []string `json:"response_types_supported"`
	SubjectTypes    []string `json:"subject_types_supported"`
	SigningAlgs     []string `json:"id_token_signing_alg_values_supported"`
	Scopes          []string `json:"scopes_supported"`
	ClaimsSupported []string `json:"claims_supported"`
}

// DiscoveryPath and JWKSPath are where, under the issuer's URL, the API
// serves the two documents.
const (
	DiscoveryPath = "/.well-known/openid-configuration"
	JWKSPath      = "/.well-known/jwks.json"
)

// Discovery is the issuer's metadata.
func (i *Issuer) Discovery() Discovery {
	return Discovery{Issuer: i.issuer, JWKSURI: i.issuer + JWKSPath, ResponseTypes: []string{"id_token"}, SubjectTypes: []string{"public"},
		SigningAlgs: []string{Algorithm}, Scopes: []string{"openid"},
		ClaimsSupported: []string{"iss", "sub", "aud", "exp", "iat", "nbf", "jti", "project_id", "sandbox_id", "token_name"}}
}

// JWK is one public key of the key set.
type JWK struct {
	Kty string `json:"kty"`
	Use string `json:"use"`
	Alg string `json:"alg"`
	Kid string `json:"kid"`
	N   string `json:"n"`
	E   string `json:"e"`
}

// JWKS is the issuer's key set (/.well-known/jwks.json): every key that
// signs, will sign, or signed tokens that may still be valid.
type JWKS struct {
	Keys []JWK `json:"keys"`
}

// KeySet is the key set now.
func (i *Issuer) KeySet() JWKS {
	out := JWKS{Keys: []JWK{}}
	for _, k := range i.published(i.cfg.Now()) {
		out.Keys = append(out.Keys, JWK{Kty: "RSA", Use: "sig", Alg: Algorithm, Kid: k.ID,
			N: base64.RawURLEncoding.EncodeToString(k.public.N.Bytes()), E: base64.RawURLEncoding.EncodeToString(big.NewInt(int64(k.public.E)).Bytes())})
	}
	return out
}
