// Not plan/'s face: a front end must not include it.
#pragma once
