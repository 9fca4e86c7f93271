// A library folder of the face-rule fixture.
#pragma once
