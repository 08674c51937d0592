// Small chains shared by several tests.
#pragma once

namespace fusor::testing {

// A feed-forward block whose weights are declared constant; odd extents,
// so that tiles have remainders.
inline constexpr char kConstFfn[] = R"(
dim m=37 c=48 f=80 o=24
in X[m,c] W1[c,f] B1[f] W2[f,o]
const W1 B1 W2
H[m,f] = sum(c) X[m,c] * W1[c,f]
G[m,f] = gelu(H[m,f] + B1[f])
Y[m,o] = sum(f) G[m,f] * W2[f,o]
out Y
)";

// C = A·B, E = C·D: the MCFuser GEMM chain (loops m, n, k, h).
inline constexpr char kGemmChain[] = R"(
chain gemm2
dim m=64 n=64 k=32 h=32
in A[m,k] B[k,n] D[n,h]
C[m,n] = sum(k) A[m,k] * B[k,n]
E[m,h] = sum(n) C[m,n] * D[n,h]
out E
)";

// Masked f16 attention whose extents no tile divides.
inline constexpr char kMaskedF16Attention[] = R"(
chain attn_f16
dtype f16
dim b=2 m=33 n=47 k=16 h=24
in Q[b,m,k] K[b,n,k] V[b,n,h] M[m,n]
S[b,m,n] = sum(k) Q[b,m,k] * K[b,n,k] * 0.25
P[b,m,n] = softmax(n) S[b,m,n] + M[m,n] * 4
O[b,m,h] = sum(n) P[b,m,n] * V[b,n,h]
out O
)";

// A strided 3x3 convolution, ReLU, and a 1x1 convolution.
inline constexpr char kConvChain[] = R"(
chain conv
dtype f32
dim n=2 c=8 k=16 p=9 q=11 r=3 s=3 j=12 y=19 x=23
in I[n,c,y,x] W1[k,c,r,s] W2[j,k]
T[n,k,p,q] = sum(c,r,s) I[n,c,p*2+r,q*2+s] * W1[k,c,r,s]
U[n,k,p,q] = relu(T[n,k,p,q])
O[n,j,p,q] = sum(k) U[n,k,p,q] * W2[j,k]
out O
)";

}  // namespace fusor::testing
