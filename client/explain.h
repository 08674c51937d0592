// `fusor explain`: the size of a chain's schedule space at every pruning
// stage and the model's best candidates, with t_mem, t_comp, alpha, t_estm.
#pragma once

#include <string>

#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "common/space/space.h"

namespace fusor::client {

std::string FormatExplain(const ir::Chain& chain, const hw::TargetDesc& target, const space::Space& space, int top);

}  // namespace fusor::client
